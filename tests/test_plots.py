"""Plots a person can read: a reliability diagram says how many examples each bar stands for and keeps its legend off
the bars; a run's curves have whole-round ticks, however few its rounds."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from bayesadmm.evaluation.diagrams import pyplot, reliability_figure, run_figure


def _diagram(counts, accuracy):
    bins = len(counts)
    return {
        "reliability": {
            "bins": bins,
            "edges": [b / bins for b in range(bins + 1)],
            "count": counts,
            "accuracy": accuracy,
            "confidence": [(b + 0.5) / bins for b in range(bins)],
            "ece": 0.05,
        }
    }


def test_a_reliability_diagram_writes_each_bins_count_and_keeps_its_legend_off_the_bars():
    counts = [0, 0, 3, 0, 12, 40, 95, 310, 1200, 8340]
    accuracy = [0, 0, 0.33, 0, 0.5, 0.55, 0.7, 0.8, 0.9, 0.99]  # the tallest bars are where a legend inside would sit
    report = {"mean": _diagram(counts, accuracy), "predictive": _diagram(counts, accuracy)}
    fig = reliability_figure(report, "title")
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            written = [t.get_text() for t in ax.texts if t.get_gid() == "bin-count"]
            assert written == [f"{c:,}" for c in counts if c]  # every non-empty bin, and only those
            assert ax.get_legend() is None
        (legend,) = fig.legends
        box = legend.get_window_extent(renderer)
        assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes)  # outside every panel
        assert box.y1 <= min(ax.get_window_extent(renderer).y0 for ax in fig.axes)  # under them
    finally:
        pyplot().close(fig)


@pytest.mark.parametrize("rounds", [2, 3, 7])
def test_a_short_runs_curves_have_whole_round_ticks(rounds):
    history = [{"round": r, "test_acc": 0.5 + r / 100, "ens_test_acc": 0.5, "test_nll": 1.0}
               for r in range(1, rounds + 1)]  # fmt: skip
    fig = run_figure(history, "short")
    try:
        fig.canvas.draw()
        for ax in fig.axes:
            low, high = ax.get_xlim()
            ticks = [t for t in ax.get_xticks() if low <= t <= high]
            assert ticks and all(float(t).is_integer() for t in ticks), ticks
    finally:
        pyplot().close(fig)


def test_a_run_that_measured_nothing_plottable_has_no_curves():
    assert run_figure([{"round": 1, "seconds": 1.0}]) is None
