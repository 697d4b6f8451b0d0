"""Summaries of a split: label counts, heterogeneity statistics and their description."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from bayesadmm.data.partitions._checks import _F64, _check_labels, _check_positive_int


def label_counts(labels, parts: Sequence[torch.Tensor], num_classes: int) -> torch.Tensor:
    """(K, C) int64 matrix: entry (k, c) is how many of client k's examples have label c.

    Raises:
        ValueError: a label outside [0, num_classes) among the clients'
            examples, or an index out of range.
    """
    labels = _check_labels(labels)
    num_classes = _check_positive_int(num_classes, "num_classes")
    rows = []
    for k, part in enumerate(parts):
        part = torch.as_tensor(part, dtype=torch.int64)
        if part.numel() and (int(part.min()) < 0 or int(part.max()) >= labels.numel()):
            raise ValueError(f"client {k} has indices outside [0, {labels.numel()})")
        ys = labels[part]
        if ys.numel() and (int(ys.min()) < 0 or int(ys.max()) >= num_classes):
            raise ValueError(f"client {k} has labels outside [0, {num_classes})")
        rows.append(torch.bincount(ys, minlength=num_classes))
    if not rows:
        return torch.zeros(0, num_classes, dtype=torch.int64)
    return torch.stack(rows)


def _clients_for_share(sizes: torch.Tensor, share: float) -> int:
    """The fewest clients that together hold at least ``share`` of the data."""
    cumulative = torch.cumsum(torch.sort(sizes, descending=True)[0].to(_F64), 0) / sizes.sum()
    return int((cumulative < share - 1e-12).sum()) + 1


def heterogeneity(labels, parts: Sequence[torch.Tensor], num_classes: int, top: int = 4) -> dict:
    """The statistics :func:`describe` prints, as numbers.

    Keys: ``num_clients``, ``assigned`` (examples on some client),
    ``num_examples`` (len(labels)), ``disjoint`` (no example on two
    clients), ``sizes`` (list), ``largest2_share`` (share of the assigned
    data on the 2 largest clients), ``clients_for_50`` / ``clients_for_90``
    (fewest clients holding 50 % / 90 % of it), ``top_class_share`` (per
    non-empty client, the share of its data in its ``top`` largest classes),
    ``classes_per_client`` (per client, the number of classes it has).
    """
    counts = label_counts(labels, parts, num_classes)
    sizes = counts.sum(dim=1)
    if sizes.numel() == 0 or int(sizes.sum()) == 0:
        raise ValueError("the split holds no examples")
    indices = torch.cat([torch.as_tensor(p, dtype=torch.int64) for p in parts])
    top_counts = torch.topk(counts, min(top, num_classes), dim=1)[0].sum(dim=1)
    nonempty = sizes > 0
    return {
        "num_clients": len(parts),
        "num_examples": int(torch.as_tensor(labels).numel()),
        "assigned": int(torch.unique(indices).numel()),
        "disjoint": bool(torch.unique(indices).numel() == indices.numel()),
        "sizes": sizes.tolist(),
        "largest2_share": float(torch.topk(sizes, min(2, sizes.numel()))[0].sum() / sizes.sum()),
        "clients_for_50": _clients_for_share(sizes, 0.5),
        "clients_for_90": _clients_for_share(sizes, 0.9),
        "top": top,
        "top_class_share": (top_counts[nonempty].to(_F64) / sizes[nonempty]).tolist(),
        "classes_per_client": (counts > 0).sum(dim=1).tolist(),
    }


def _spread(values: Sequence[float], fmt: str) -> str:
    t = torch.tensor(values, dtype=_F64)
    return (
        f"min {format(float(t.min()), fmt)}, median {format(float(t.median()), fmt)}, max {format(float(t.max()), fmt)}"
    )


def describe(labels, parts: Sequence[torch.Tensor], num_classes: int) -> str:
    """A few lines on how heterogeneous a split is.

    Sizes, the share of the data on the 2 largest clients, how many clients
    hold 50 % and 90 % of it, and the share of each client's data in its top
    4 classes -- the numbers the FedLap paper quotes for its split ("2 clients
    have 50 % of the data, 6 clients 90 %; 60-95 % of a client's data within
    4 classes").
    """
    s = heterogeneity(labels, parts, num_classes)
    total = sum(s["sizes"])
    coverage = "all" if s["assigned"] == s["num_examples"] else f"{s['assigned']} of {s['num_examples']}"
    overlap = "disjoint" if s["disjoint"] else "OVERLAPPING"
    return "\n".join(
        [
            f"{s['num_clients']} clients, {total} examples ({coverage} examples assigned, {overlap})",
            f"client sizes: {_spread(s['sizes'], '.0f')}",
            f"largest 2 clients hold {s['largest2_share']:.1%} of the data; "
            f"{s['clients_for_50']} clients hold 50 %, {s['clients_for_90']} hold 90 %",
            f"share of a client's data in its top {s['top']} classes: {_spread(s['top_class_share'], '.1%')}",
            f"classes per client: {_spread(s['classes_per_client'], '.0f')}",
        ]
    )
