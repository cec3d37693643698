"""Gluon operations that Triton 3.6's Gluon builds in its IR but does not name in its language.

``tma_reduce_add``: a TMA reduce-add (``cp.reduce.async.bulk.tensor ... .add``) of a shared-memory tile into
global memory, the op Triton's own ``tensor_descriptor.atomic_add`` lowers to; Gluon's ``tma`` module has the
plain store (``async_copy_shared_to_global``) only. Like that store it is asynchronous: ``tma.store_wait(n)``
waits until at most n of the issuing thread's bulk copies still read shared memory, and the tile must be
written (and ``fence_async_shared``) before it is issued.
"""
from __future__ import annotations

from triton._C.libtriton import ir
from triton.experimental.gluon.language._core import builtin


@builtin
def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Add the shared-memory tile `src` into the box of `tensor_desc` at `coord` (fp32: element-wise adds)."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)
