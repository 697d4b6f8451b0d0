"""A PNG of a split's per-client label counts (:func:`plot_label_distribution`)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from bayesadmm.data.partitions.summary import describe, label_counts


def plot_label_distribution(
    labels,
    parts: Sequence[torch.Tensor],
    num_classes: int,
    path: str | os.PathLike,
    title: str | None = None,
) -> None:
    """Write a PNG of the per-client label counts to ``path``.

    Up to 30 clients and 20 classes: one stacked bar per client, a colour per
    class, with a legend.  More clients or classes: a heatmap (classes x
    clients, colour = share of the client's examples in the class) under a
    bar chart of the client sizes, which stays readable for 100 clients or
    100 classes.  The description from :func:`describe` is printed under the
    plot.

    Uses matplotlib's object API with the Agg canvas (no pyplot state, no
    display needed).
    """
    # matplotlib is imported on first use: it is slow to import and only plots need it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    counts = label_counts(labels, parts, num_classes).numpy()
    num_clients = counts.shape[0]
    if num_clients == 0:
        raise ValueError("no clients to plot")
    summary = describe(labels, parts, num_classes)

    if num_clients <= 30 and num_classes <= 20:
        fig = _stacked_bars(counts)
    else:
        fig = _heatmap(counts)
    fig.suptitle(title or f"Label distribution over {num_clients} clients")
    fig.text(0.01, 0.0, summary, fontsize=7, family="monospace", va="top", ha="left")
    FigureCanvasAgg(fig)
    fig.savefig(os.fspath(path), dpi=110, bbox_inches="tight")


def _stacked_bars(counts):
    """One stacked bar per client, a colour per class, with a legend."""
    import matplotlib
    from matplotlib.figure import Figure

    num_clients, num_classes = counts.shape
    clients = list(range(num_clients))
    fig = Figure(figsize=(max(6.0, 0.45 * num_clients + 3.0), 5.5), layout="constrained")
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["tab10" if num_classes <= 10 else "tab20"]
    bottom = [0] * num_clients
    for c in range(num_classes):
        ax.bar(clients, counts[:, c], bottom=bottom, color=cmap(c), label=str(c), width=0.8)
        bottom = [b + v for b, v in zip(bottom, counts[:, c], strict=True)]
    ax.set_xticks(clients)
    ax.set_xlabel("client")
    ax.set_ylabel("examples")
    ax.legend(title="class", loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    return fig


def _heatmap(counts):
    """A heatmap of each client's class shares (classes x clients) under a bar chart of the client sizes."""
    import numpy as np
    from matplotlib.figure import Figure

    num_clients, num_classes = counts.shape
    sizes = counts.sum(axis=1)
    clients = list(range(num_clients))
    fig = Figure(figsize=(min(16.0, max(7.0, 0.12 * num_clients + 3.0)), 7.5), layout="constrained")
    top_ax, heat_ax = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [1, 3]})
    top_ax.bar(clients, sizes, width=0.9, color="0.35")
    top_ax.set_ylabel("examples")
    # Colour = share of the client's own data, not the raw count: the
    # sizes are in the bar chart already, and raw counts would make the
    # class mix of small clients invisible.
    shares = counts / np.maximum(sizes, 1)[:, None]
    image = heat_ax.imshow(
        shares.T,
        aspect="auto",
        interpolation="nearest",
        cmap="viridis",
        vmin=0.0,
        vmax=max(float(shares.max()), 1e-12),
        extent=(-0.5, num_clients - 0.5, num_classes - 0.5, -0.5),
    )
    if num_classes <= 20:
        heat_ax.set_yticks(range(num_classes))
    if num_clients <= 30:
        heat_ax.set_xticks(clients)
    heat_ax.set_xlabel("client")
    heat_ax.set_ylabel("class")
    fig.colorbar(image, ax=heat_ax, label="share of the client's examples")
    return fig
