"""Training launcher: `python -m launcher.train --config FILE [--set key=value ...]`.

Modules: config (typed RunConfig, validation), overrides (--set parsing), distributed
(process group), cpu_memory (glibc allocator setting for CPU runs), engine (DeepSpeed +
AdamW + schedule), schedule (warmup-cosine LR), data (batches from data_prep), tracking
(MLflow), train (the loop and CLI).
"""
