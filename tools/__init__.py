"""Developer tools for the SageBwd kernels (not shipped with the package): run from the repository root.

    python -m tools.offline        compile the kernels for sm_90 without a GPU: registers, spills, wgmma
    python -m tools.offline --loop-mix   SASS instructions per score element and the issue floors (sass_mix)
    python -m tools.ncu_stalls CSV ncu's stall reasons per kernel as a table
    python -m tools.dq_add_bench   what a fused backward's fp32 dQ adds would cost (CUDA)
    python -m tools.quant_study    FP8 / per-fragment scale variants of the token contract: rel-L2 table (CPU)
"""
