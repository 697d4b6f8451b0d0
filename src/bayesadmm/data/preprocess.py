"""The preprocessing of the illustrative experiments: average-pool :func:`downsample` and :func:`class_pair_split`."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def downsample(images: torch.Tensor, size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Average-pool square images down to ``size x size``.

    Each output pixel is the mean of a ``k x k`` block of input pixels,
    ``k = H // size``; values stay on the input scale (0..255 for raw uint8
    images), and no normalisation is applied.

    Args:
        images: tensor of shape ``(N, H, H)`` (e.g. ``(N, 28, 28)``), any
            real dtype.
        size: output side length; must divide ``H`` (7 or 14 for 28x28).
        dtype: floating dtype of the result (default float32).

    Returns:
        Tensor of shape ``(N, size, size)`` and dtype ``dtype``.

    Raises:
        ValueError: wrong shape, ``size`` not dividing ``H``, or a
            non-floating ``dtype``.
    """
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype, got {dtype}")
    if images.ndim != 3 or images.shape[1] != images.shape[2]:
        raise ValueError(f"expected images of shape (N, H, H), got {tuple(images.shape)}")
    side = images.shape[1]
    if not isinstance(size, int) or size <= 0 or side % size != 0:
        divisors = [d for d in range(1, side + 1) if side % d == 0]
        raise ValueError(f"size must be a positive divisor of the image side {side} (one of {divisors}), got {size!r}")
    k = side // size
    n = images.shape[0]
    # Split each axis into (block index, offset within block) and average
    # over the offsets.  Converting first avoids uint8 overflow in the sum.
    blocks = images.to(dtype).reshape(n, size, k, size, k)
    return blocks.mean(dim=(2, 4))


def class_pair_split(
    labels: torch.Tensor,
    pairs: Iterable[Iterable[int]] = ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9)),
) -> list[torch.Tensor]:
    """Heterogeneous federated split: client ``k`` gets the classes in ``pairs[k]``.

    This is the split of the illustrative experiments: with the default pairs,
    five clients each hold all examples of two classes.  Examples whose label
    is in no pair are left out.  A group may hold any number of classes.

    Args:
        labels: 1-D integer tensor of class labels.
        pairs: one group of labels per client; groups must not share labels
            (so that no example goes to two clients).

    Returns:
        One int64 tensor per client with the indices (into ``labels``) of its
        examples, in increasing order.

    Raises:
        ValueError: ``labels`` not 1-D, or a label in more than one group.
    """
    labels = torch.as_tensor(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {tuple(labels.shape)}")
    groups = [tuple(int(c) for c in group) for group in pairs]
    seen: set[int] = set()
    for group in groups:
        repeated = seen.intersection(group)
        if repeated:
            raise ValueError(f"label(s) {sorted(repeated)} appear in more than one group of {groups}")
        seen.update(group)
    # nonzero() returns indices in increasing order.
    return [
        torch.isin(labels, torch.tensor(group, dtype=labels.dtype)).nonzero().flatten().to(torch.int64)
        for group in groups
    ]
