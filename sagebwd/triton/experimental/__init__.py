"""Experimental kernels: correct and tested, measured slower than the defaults, never a default.

``forward_hopper`` (a Gluon forward overlapping S with the softmax: not faster), ``fused_hopper``
(the whole d=64 backward in one kernel, dQ by atomics: 27-31% slower, dQ not bit-reproducible) and
``dkdv_roles_hopper`` (the d=128 token dK/dV in one launch, split by role: bit-identical, 6-10% slower).
They run only where a `kernels` choice names them (sagebwd.triton.registry: forward "gluon",
"fused", dkdv "gluon-roles"); the default path never imports this package. docs/kernel-notes.md
has their measurements.
"""
