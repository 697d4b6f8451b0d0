"""The plots of one run: its curves (`run_figure`: the metrics per round, curves.png, `try_plot_run`) and the
reliability diagrams of a classification run's uncertainty, `reliability.json` (the numbers) and `reliability.png`
(the plot: at the server mean and for the posterior predictive, side by side), written into the run directory at the
end of a run whose likelihood has confidence bins (`write_reliability`) from
`bayesadmm.evaluation.metrics.evaluate_uncertainty`'s report; and the uncertainty columns of the comparison table
(`with_uncertainty`). Nothing here reads the configuration layer, so the engine's hook (`evaluation.leavings`) draws
them without it."""

from __future__ import annotations

import sys
from pathlib import Path

from bayesadmm.engine.rundir import write_json

__all__ = [
    "PLOTTABLE",
    "eval_set",
    "plot_run",
    "run_figure",
    "round_ticks",
    "try_plot_run",
    "plot_reliability",
    "reliability_figure",
    "write_reliability",
    "UNCERTAINTY_COLUMNS",
    "with_uncertainty",
    "pyplot",
]


def pyplot():
    """matplotlib's pyplot on the Agg backend (files, no window), imported when a plot is drawn: matplotlib is
    needed only then."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# what a run's plot shows: the first two of these its metrics have (classification: accuracy and NLL; regression:
# RMSE and NLL; a user-written likelihood: NLL)
PLOTTABLE = (
    ("acc", "accuracy (%)", 100.0),
    ("rmse", "RMSE", 1.0),
    ("nll", "NLL", 1.0),
    ("calibration_error", "interval calibration error", 1.0),
)


def eval_set(history: list[dict]) -> str:
    """The split a run is evaluated on: "test", or "val" for a run evaluated on a held-out part of the training set
    (`validation` > 0)."""
    return "val" if history and any(key.startswith("val_") for key in history[0]) else "test"


def plot_run(history: list[dict], path: Path, title: str = "") -> None:
    """`run_figure` of `history`, written to `path` (nothing where the run measured none of `PLOTTABLE`)."""
    plt = pyplot()
    fig = run_figure(history, title)
    if fig is None:
        return
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_figure(history: list[dict], title: str = ""):
    """Accuracy and NLL (or what the run measured instead, `PLOTTABLE`) per round of one run, at the server mean and
    for the predictive where there is one, on whole-round ticks; None where it measured none of them (a Flower run
    without a server-side evaluation set)."""
    plt = pyplot()
    rounds = [line["round"] for line in history]
    where = eval_set(history)
    shown = [m for m in PLOTTABLE if f"{where}_{m[0]}" in history[0]][:2]
    if not shown:
        return None
    fig, axes = plt.subplots(1, len(shown), figsize=(5 * len(shown), 3.8), squeeze=False)
    for ax, (metric, label, scale) in zip(axes[0], shown, strict=True):
        ax.plot(rounds, [scale * line[f"{where}_{metric}"] for line in history], marker=".", label="at mean")
        if f"ens_{where}_{metric}" in history[0]:
            ax.plot(
                rounds,
                [scale * line[f"ens_{where}_{metric}"] for line in history],
                marker=".",
                label="posterior predictive",
            )
        ax.set_xlabel("round")
        round_ticks(ax)
        ax.set_ylabel(f"{'validation' if where == 'val' else 'test'} {label}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def round_ticks(ax) -> None:
    """Whole rounds on `ax`'s x axis: a run of a few rounds gets 1, 2, 3, never 1.25 or 2.5."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def try_plot_run(history: list[dict], path: Path, title: str = "") -> None:
    """`plot_run`, with a failure reported on stderr instead of raised: a plot is never worth losing a run's status."""
    try:
        plot_run(history, path, title)
    except Exception as exc:  # noqa: BLE001 — any plotting failure (a missing backend, a full disk)
        print(f"warning: could not plot {path}: {exc}", file=sys.stderr)


SIDES = {"mean": "at the mean", "predictive": "posterior predictive"}


def plot_reliability(report: dict, path: Path, title: str = "") -> None:
    """`reliability_figure` of `report`, written to `path`."""
    plt = pyplot()
    fig = reliability_figure(report, title)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def reliability_figure(report: dict, title: str = ""):
    """One panel per side of `report` (mean, predictive): each bin's accuracy as a bar at its confidence range with
    its number of examples written at its foot, the bin's mean confidence as a dot and the diagonal of perfect
    calibration, with the ECE in the panel's title; one legend under the panels, where it hides no bar."""
    plt = pyplot()
    sides = [side for side in SIDES if side in report]
    fig, axes = plt.subplots(1, len(sides), figsize=(4.6 * len(sides), 4.9), squeeze=False, layout="constrained")
    for ax, side in zip(axes[0], sides, strict=True):
        diagram = report[side]["reliability"]
        edges, width = diagram["edges"], 1.0 / diagram["bins"]
        filled = [b for b, count in enumerate(diagram["count"]) if count]
        ax.bar([edges[b] for b in filled], [diagram["accuracy"][b] for b in filled], width=width, align="edge",
               edgecolor="black", alpha=0.7, label="accuracy of the bin (its examples at its foot)")  # fmt: skip
        for b in filled:  # how many examples a bar stands for: a tall bar of 3 examples says little
            ax.text(edges[b] + width / 2, 0.015, f"{diagram['count'][b]:,}", rotation=90, ha="center", va="bottom",
                    fontsize=6.5, color="black", gid="bin-count")  # fmt: skip
        ax.plot([diagram["confidence"][b] for b in filled], [diagram["accuracy"][b] for b in filled], "o",
                color="C1", markersize=3, label="(mean confidence, accuracy)")  # fmt: skip
        ax.plot([0, 1], [0, 1], "--", color="gray", label="perfectly calibrated")
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy")
        ax.set_title(f"{SIDES[side]}: ECE {diagram['ece']:.3f}")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize="small", frameon=False)
    fig.suptitle(title)
    return fig


def write_reliability(run_dir: Path, report: dict, title: str = "") -> None:
    """`reliability.json` (the report: each side's metrics and diagram) and `reliability.png` in `run_dir`; a
    failure is reported on stderr, not raised: a plot is never worth losing a run's status."""
    try:
        write_json(run_dir / "reliability.json", report)
        plot_reliability(report, run_dir / "reliability.png", title)
    except Exception as exc:  # noqa: BLE001 — any failure to write or plot (a missing backend, a full disk)
        print(f"warning: could not write the reliability diagram in {run_dir}: {exc}", file=sys.stderr)


# The comparison table's uncertainty columns (metric, label, scale) for classification runs that measured them (runs
# given an OOD set: `bayesadmm.run(ood=...)`, the config key `ood`); PERCENT in reports shows the sel_acc ones as %.
UNCERTAINTY_COLUMNS = (
    ("ood_auroc_entropy", "OOD AUROC (entropy)", 1.0),
    ("ood_auroc_maxprob", "OOD AUROC (max p)", 1.0),
    ("sel_acc50", "acc. @50 % (%)", 100.0),
    ("sel_acc80", "acc. @80 % (%)", 100.0),
    ("sel_acc90", "acc. @90 % (%)", 100.0),
)


def with_uncertainty(metrics: tuple, histories: list[list[dict]], split: str) -> tuple:
    """`metrics` (a comparison's columns) followed by the `UNCERTAINTY_COLUMNS` that at least one of `histories`
    measured on `split`, where `metrics` are a classifier's (accuracy first); the others as they are."""
    if metrics[0][0] != "acc":
        return metrics
    measured = [c for c in UNCERTAINTY_COLUMNS if any(f"{split}_{c[0]}" in h[0] for h in histories)]
    return metrics + tuple(measured)
