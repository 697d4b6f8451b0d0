"""Tabular regression data: scikit-learn's bundled diabetes set, which needs no download.

442 patients, 10 baseline features (age, sex, body-mass index, mean blood pressure and six blood-serum measurements)
and the target, a quantitative measure of disease progression one year later (integers 25–346; Efron et al., 2004,
*Least angle regression*). `load_diabetes` returns the features as recorded, not scikit-learn's version scaled with
the statistics of all 442 rows: a run standardises them with the statistics of its own training rows
(`standardise`), so nothing of the test set leaks into training. scikit-learn is an optional dependency:
``pip install 'bayesadmm[tabular]'``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from bayesadmm.data.mnist_subset import MissingExtraError

EXTRA = "tabular"
DIABETES_SIZE, DIABETES_FEATURES = 442, 10

__all__ = ["DIABETES_FEATURES", "DIABETES_SIZE", "EXTRA", "load_diabetes", "split_rows", "standardise"]


def load_diabetes() -> tuple[Tensor, Tensor]:
    """Features (442, 10) and targets (442,), both float64, in scikit-learn's row order."""
    try:
        from sklearn.datasets import load_diabetes as sklearn_diabetes
    except ImportError as exc:
        raise MissingExtraError(
            f"the diabetes data set is scikit-learn's: pip install 'bayesadmm[{EXTRA}]' (or pip install scikit-learn)"
        ) from exc
    X, y = sklearn_diabetes(return_X_y=True, scaled=False)
    return torch.as_tensor(X, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)


def split_rows(n: int, fraction: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """A random split of rows 0..n-1: (the rest, round(fraction·n) held-out rows), each sorted; at least one row in
    each part."""
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    if n < 2:
        raise ValueError(f"cannot split {n} rows into two non-empty parts")
    held = min(max(1, round(fraction * n)), n - 1)
    order = torch.randperm(n, generator=generator)
    return order[held:].sort().values, order[:held].sort().values


def standardise(train: Tensor, *others: Tensor) -> tuple[Tensor, ...]:
    """`train` and `others` shifted and scaled per column (or as a whole, for 1-D targets) by the mean and standard
    deviation of `train` alone; a constant column is only shifted."""
    mean = train.mean(dim=0)
    std = train.std(dim=0)
    std = torch.where(std > 0, std, torch.ones_like(std))
    return tuple((t - mean) / std for t in (train, *others))
