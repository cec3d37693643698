"""The seeded train/val split, by document.

Documents are numbered in the source's fixed order; a seeded permutation picks exactly
round(n * val_fraction) of them (at least one when the fraction is above zero) for validation.
Splitting whole documents keeps any text of a validation document out of training. The
choice depends only on (seed, number of documents, fraction), so every worker, and every
resumed run, derives the same split without storing it.
"""

from __future__ import annotations

import numpy as np

from .errors import DataPrepError


def count_val_documents(n_docs: int, val_fraction: float) -> int:
    if val_fraction <= 0:
        return 0
    if n_docs < 2:
        raise DataPrepError(f"only {n_docs} document(s): a train/val split by document needs at least 2. "
                            "Add documents, or pass --val-fraction 0 to skip the validation split.")
    return min(n_docs - 1, max(1, round(n_docs * val_fraction)))


def val_document_indices(n_docs: int, val_fraction: float, seed: int) -> np.ndarray:
    """Sorted global indices of the validation documents."""
    n_val = count_val_documents(n_docs, val_fraction)
    rng = np.random.default_rng(seed)
    return np.sort(rng.permutation(n_docs)[:n_val]).astype(np.int64)
