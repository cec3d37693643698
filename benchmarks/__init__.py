"""GPU benchmarks of SageBwd (not shipped with the package), run from the repository root:

    python -m benchmarks.attention --check --json out.json     kernels vs torch SDPA, and the GPU checks
"""
