"""Experimental kernels: correct and tested, measured slower than the defaults, never a default.

``forward_hopper`` (a Gluon forward overlapping S with the softmax: not faster) and ``fused_hopper``
(the whole d=64 backward in one kernel, dQ by atomics: 27-31% slower, dQ not bit-reproducible).
They run only where a `kernels` choice names them (sagebwd.triton.registry: forward "gluon",
"fused"); the default path never imports this package. docs/kernel-notes.md has their measurements.
"""
