"""The comparison table across runs (the papers' Table 1 format) and its overlay plot.

Table entries follow the papers: for each run, the mean of a metric over the last 3 rounds up to round R
(rounds R−2, R−1, R); then mean ± std over the runs (seeds) of a method. Methods with a Gaussian posterior get two
rows: at the server mean m_g, and for the posterior predictive (`ens_` metrics). The metrics are the likelihood's:
accuracy, NLL and ECE for classification runs; RMSE, NLL and the coverage of the central 90 % predictive interval
for Gaussian regression runs (`TABLES`); classification runs given an OOD set add the OOD AUROCs and selective
accuracies (`diagrams.UNCERTAINTY_COLUMNS`).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from bayesadmm.engine.identity import completed
from bayesadmm.evaluation.diagrams import eval_set, pyplot, round_ticks, with_uncertainty
from bayesadmm.evaluation.results import RUNS_FILE, gather, write_runs_file
from bayesadmm.evaluation.tables import latex, markdown_table, mean_std
from bayesadmm.experiments.config import RunConfig
from bayesadmm.experiments.scenario_data import references

METRICS = (("acc", "accuracy (%)", 100.0), ("nll", "NLL", 1.0))  # plotted
TABLE_METRICS = METRICS + (("ece", "ECE", 1.0),)  # tabulated for classification runs
# what the table shows of runs whose metrics include the first key: classification, Gaussian regression, or only
# the NLL (a user-written likelihood)
TABLES: tuple[tuple[tuple[str, str, float], ...], ...] = (
    TABLE_METRICS,
    (
        ("rmse", "RMSE", 1.0),
        ("nll", "NLL", 1.0),
        ("coverage90", "90 % coverage (%)", 100.0),
        ("calibration_error", "calibration error", 1.0),
    ),
    (("nll", "NLL", 1.0),),
)
PERCENT = ("acc", "coverage90", "sel_acc50", "sel_acc80", "sel_acc90")  # shown with one decimal, in per cent


def table_metrics(history: list[dict]) -> tuple[tuple[str, str, float], ...]:
    """The metrics a comparison shows of a run: the first of `TABLES` whose first metric the run measured."""
    where = eval_set(history)
    for metrics in TABLES:
        if f"{where}_{metrics[0][0]}" in history[0]:
            return metrics
    raise ValueError(f"the run measured none of {', '.join(m[0][0] for m in TABLES)} on its {where} set")


WINDOW = 3  # a table's cell at round R averages a run's evaluations at rounds R − 2, R − 1 and R (the papers' rule)


def _last3(history: list[dict], key: str, round_: int) -> float | None:
    values = [line[key] for line in history if round_ - 2 <= line["round"] <= round_ and key in line]
    return statistics.fmean(values) if len(values) == WINDOW else None


def _why_empty(histories: list[list[dict]], key: str, round_: int) -> str:
    """Why a group's cell at `round_` is "—": the window starts before round 1, the runs end before `round_`, or they
    did not measure `key` at all three rounds of the window."""
    if round_ < WINDOW:
        return f"@{round_} needs rounds {round_ - 2}–{round_}, from before round 1: @{WINDOW} is the first with values"
    last = max(h[-1]["round"] for h in histories)
    if last < round_:
        return f"@{round_}: the runs end at round {last} (`--at {last}` shows their last rounds)"
    return f"@{round_}: the runs did not measure {key} at each of rounds {round_ - 2}–{round_}"


def footnote(rounds: Sequence[int], empty: Sequence[str] = (), paper: bool = False) -> str:
    """What a comparison table's cells are (the window, the rows, seconds per round) and why a cell is "—"."""
    r = max(rounds)
    lines = [
        f"@R: a run's mean over rounds R−2, R−1 and R (@{r}: rounds {r - 2}–{r}), then mean ± std over the row's runs "
        "(seeds). (m_g) rows: the posterior's mean m_g as a point estimate; (predictive): the posterior predictive."
    ]
    if paper:
        lines.append("paper: the published number (mean over 3 seeds, the same window); in brackets ours − paper.")
    else:
        lines.append(
            "s/round: the median seconds of a round's training (client updates and server update) after the first."
        )
    lines += [why if why.startswith("/ —") else f"—: {why}." for why in dict.fromkeys(empty)]
    return "\n".join(lines)


def method_label(config: dict) -> str:
    """The row name of a run: its method, plus the local inference where a method has several (FedEP's I, L, M, V),
    so that runs differing in it are not averaged as if they were seeds."""
    inference = config.get("hparams", {}).get("inference")
    method = config.get("method") or config["algorithm"]  # a preset run's method, or bayesadmm.run's algorithm
    return f"{method}-{inference}" if inference else method


# Config keys in which runs may differ and still be seeds of one setting: the seed itself, and what changes where or
# how a run computed but not its numbers (the folder, the data's folder, the worker count, the checkpoint interval,
# where a run was stopped to be resumed).
NOT_SETTINGS = frozenset({"seed", "out", "data_dir", "workers", "checkpoint_every", "stop_at", "log"})


def setting_of(config: dict) -> dict[str, str]:
    """A run's whole configuration as flat `key: JSON value` pairs, without `NOT_SETTINGS` (nested dicts such as
    `hparams` or bayesadmm.run's `settings` are flattened: their keys stand for themselves). A preset run's config
    from an older version may lack keys added since, and an older record the hyperparameters that were not set: they
    count as their defaults (`engine.identity.completed`)."""
    if "method" in config and "settings" not in config:
        config = {**RunConfig().to_json(), **config}
    config = completed(config)  # the hyperparameters an older record left out, at their defaults
    flat: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict) and key in ("hparams", "settings"):
            flat.update(setting_of(value))
        elif isinstance(value, dict) and key == "likelihood_params":  # as the command line names them
            flat.update({f"likelihood.{k}": json.dumps(v, sort_keys=True) for k, v in value.items()})
        elif key == "run":  # the run's record (`runspec.RunSpec`): the door's own keys beside it say the same
            continue
        elif key not in NOT_SETTINGS:
            flat[key] = json.dumps(value, sort_keys=True)
    return {k: v for k, v in flat.items() if k not in NOT_SETTINGS}


def setting_labels(configs: list[dict]) -> list[str]:
    """Each run's row name: `method_label`, plus whatever else in its configuration differs among the runs of that
    method, e.g. "fedlap-func [delta=1, tau_f=0.0001]" or "fedavg [scenario=fmnist-homog10]", so that runs of
    different settings are never averaged as if they were seeds of one. Runs that differ only in `NOT_SETTINGS`
    (the seed, the folder, the worker count, ...) share a row."""
    by_method: dict[str, list[dict[str, str]]] = defaultdict(list)
    for config in configs:
        by_method[method_label(config)].append(setting_of(config))
    varying = {
        method: sorted(key for key in set().union(*settings) if len({s.get(key) for s in settings}) > 1)
        for method, settings in by_method.items()
    }
    labels = []
    for config in configs:
        method, setting = method_label(config), setting_of(config)
        shown = ", ".join(f"{key}={_plain(setting.get(key))}" for key in varying[method])
        labels.append(f"{method} [{shown}]" if shown else method)
    return labels


def _plain(value: str | None) -> str:
    """A JSON value as a label shows it: strings without their quotes, a missing key as a dash."""
    if value is None:
        return "—"
    loaded = json.loads(value)
    return loaded if isinstance(loaded, str) else value


def paper_numbers(scenario: str) -> dict:
    """The papers' published numbers for `scenario`, keyed by our row names (METHOD for a point estimate or a
    posterior at its mean, METHOD+predictive for the posterior predictive): the scenario files' reference rows and
    any registered method's own `MethodSpec.reference` (`scenario_data.references`). Mean over 3 seeds of each run's
    mean over the last 3 rounds up to the round; acc in %, nll the test NLL."""
    table = references()
    if scenario not in table:
        raise ValueError(f"no paper numbers for scenario {scenario!r}; known: {', '.join(sorted(table))}")
    return table[scenario]


def _paper_table(groups: dict, rounds: list[int], split: str, scenario: str) -> str:
    """Ours beside the paper's, per row the paper reports: 'ours / paper (ours − paper)' for accuracy and NLL."""
    paper = paper_numbers(scenario)
    header = [_method_header(split), "runs"]
    header += [f"{label} @{r}: ours / paper" for _, label, _ in METRICS for r in rounds]
    rows, empty = [], []
    for (method, where), histories in sorted(groups.items()):
        base = method.split(" [")[0]  # a row of non-default settings is set beside the method's published numbers
        published = paper.get(base if where == "m_g" else f"{base}+predictive")
        if published is None:
            continue
        prefix = f"ens_{split}_" if where == "predictive" else f"{split}_"
        cells = [f"{method} ({where})", str(len(histories))]
        for metric, _, scale in METRICS:
            digits = 1 if metric == "acc" else 3
            published_digits = 1 if metric == "acc" else 2  # as the papers print them
            for r in rounds:
                values = [v for h in histories if (v := _last3(h, prefix + metric, r)) is not None]
                theirs = published.get(metric, {}).get(str(r))
                ours = scale * statistics.fmean(values) if values else None
                if ours is None:
                    empty.append(_why_empty(histories, prefix + metric, r))
                if theirs is None:
                    empty.append("/ —: the papers publish no number for that cell.")
                shown = (
                    "—" if ours is None else f"{ours:.{digits}f}",
                    "—" if theirs is None else f"{theirs:.{published_digits}f}",
                )
                difference = "" if ours is None or theirs is None else f" ({ours - theirs:+.{digits}f})"
                cells.append(f"{shown[0]} / {shown[1]}{difference}")
        rows.append(cells)
    if not rows:
        return f"(none of these methods has published numbers for {scenario})"
    return f"{markdown_table(header, rows)}\n\n{footnote(rounds, empty, paper=True)}"


def compare(
    sources: Sequence[Path],
    rounds: list[int],
    out_dir: Path | None = None,
    paper: str | None = None,
    only: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """The comparison table (Markdown, returned and written with a LaTeX version) and an overlay plot of the runs in
    `sources` (run folders, sweep folders or runs.jsonl files, `results.runs_in`). With `out_dir`, the runs behind
    the table are also written there as one runs.jsonl, from which the same call rebuilds the table. With `paper`
    (a scenario name), a second table sets our accuracy and NLL beside the papers' (`paper_numbers`), returned
    after the first and written to paper.md. With `only` ({"method": ["fedavg", "feddyn"]}), only the runs whose
    setting of each key is one of the values given (as `setting_labels` shows it) are compared."""
    runs, notes = _finished_runs(sources, only)
    groups, scenarios, split, metrics = _group(runs)
    header, rows, empty = _table_rows(groups, rounds, split, metrics)
    note = footnote(rounds, empty)
    markdown = f"{markdown_table(header, rows)}\n\n{note}"
    beside = _paper_table(groups, rounds, split, paper) if paper else None
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "table.md").write_text(markdown + "\n")
        (out_dir / "table.tex").write_text(latex(header, rows) + "".join(f"% {line}\n" for line in note.splitlines()))
        write_runs_file(out_dir / RUNS_FILE, runs)
        if beside is not None:
            (out_dir / "paper.md").write_text(beside + "\n")
        _plot_overlay(
            groups, out_dir / "curves.png", title=", ".join(sorted(scenarios)), split=split, metrics=metrics[:2]
        )
    text = markdown if beside is None else f"{markdown}\n\n{beside}"
    return "\n\n".join([text, "\n".join(notes)]) if notes else text


def _finished_runs(sources: Sequence[Path], only: Mapping[str, Sequence[str]] | None) -> tuple[list, list[str]]:
    """The runs of `sources` that `only` keeps and that finished a round, and the notes on what was left out."""
    gathered, notes = gather(sources)
    if only:
        gathered = [run for run in gathered if _matches(run.config, only)]
    runs = []
    for run in gathered:
        if run.history:
            runs.append(run)
        else:
            notes.append(f"dropped: {run.name} (no finished round in metrics.jsonl)")
    return runs, notes


def _group(runs: Sequence) -> tuple[dict[tuple[str, str], list[list[dict]]], set[str], str, tuple]:
    """The runs' histories grouped by (setting label, "m_g" or "predictive"), their scenarios, and the evaluation
    split and metrics they share (runs that differ in either are refused)."""
    groups: dict[tuple[str, str], list[list[dict]]] = defaultdict(list)
    scenarios, sets, kinds = set(), set(), set()
    labels = setting_labels([run.config for run in runs])
    for (_, config, history, *_), label in zip(runs, labels, strict=True):
        scenarios.add(config.get("scenario", "?"))
        sets.add(eval_set(history))
        kinds.add(table_metrics(history))
        groups[(label, "m_g")].append(history)
        if f"ens_{eval_set(history)}_{table_metrics(history)[0][0]}" in history[0]:
            groups[(label, "predictive")].append(history)
    if not groups:
        raise ValueError("none of the runs has finished a round")
    if len(sets) > 1:
        raise ValueError(
            "some runs were evaluated on a validation split and some on the test set; compare them separately"
        )
    if len(kinds) > 1:
        raise ValueError(
            "the runs measured different metrics (e.g. classification and regression runs); compare them separately"
        )
    split = sets.pop()
    return groups, scenarios, split, with_uncertainty(kinds.pop(), [h for hs in groups.values() for h in hs], split)


def _table_rows(
    groups: Mapping[tuple[str, str], list[list[dict]]], rounds: list[int], split: str, metrics: tuple
) -> tuple[list[str], list[list[str]], list[str]]:
    """The table's header, one row per group: mean ± std over its runs of each metric at each round r (a run's
    value is the mean of its evaluations at rounds r − 2, r − 1 and r; a run without all three is left out), and
    seconds per round; and why each "—" is empty (`_why_empty`)."""
    header = [_method_header(split), "runs"] + [f"{label} @{r}" for r in rounds for _, label, _ in metrics]
    header.append("s/round")
    rows, empty = [], []
    for (method, where), histories in sorted(groups.items()):
        prefix = f"ens_{split}_" if where == "predictive" else f"{split}_"
        cells = [f"{method} ({where})", str(len(histories))]
        for r in rounds:
            for metric, _, scale in metrics:
                values = [v for h in histories if (v := _last3(h, prefix + metric, r)) is not None]
                if not values:
                    cells.append("—")
                    empty.append(_why_empty(histories, prefix + metric, r))
                    continue
                cells.append(mean_std(values, scale, 1 if metric in PERCENT else 3))
        cells.append(_seconds_per_round(histories))
        rows.append(cells)
    return header, rows, empty


def _method_header(split: str) -> str:
    """The first column's header, which says when the numbers are not on the test set (a selection's validation
    split, `eval_set`), so that such a table is never read as test results."""
    return "method (validation split)" if split == "val" else "method"


def _matches(config: dict, only: Mapping[str, Sequence[str]]) -> bool:
    setting = {**setting_of(config), "seed": json.dumps(config.get("seed"))}
    return all(str(_plain(setting.get(key))) in {str(v) for v in allowed} for key, allowed in only.items())


def _seconds_per_round(histories: list[list[dict]]) -> str:
    """The wall-clock seconds of a round as the runs measured it (client updates and server update, no evaluation):
    the median over runs of each run's median round after the first (which starts workers and compiles kernels).
    It depends on the machine's load and the run's `workers` when it ran; benchmarks/engine.py times it cleanly."""
    per_run = [
        statistics.median(seconds)
        for h in histories
        if (seconds := [row["seconds"] for row in h[1:] if "seconds" in row])
    ]
    return f"{statistics.median(per_run):.1f}" if per_run else "—"


def _plot_overlay(groups, path: Path, title: str, split: str = "test", metrics=METRICS) -> None:
    plt = pyplot()
    rows = len(groups)
    # the legend goes under both panels: inside one it hides the curves once there are more than a few rows
    fig, axes = plt.subplots(
        1, len(metrics), figsize=(5.5 * len(metrics), 4 + 0.18 * ((rows + 2) // 3)), layout="constrained", squeeze=False
    )
    axes = axes[0]
    # one colour per method, its mean dashed and its predictive solid
    methods = sorted({method for method, _ in groups})
    palette = [*plt.get_cmap("tab10").colors, "black", "darkgoldenrod", "teal", "magenta", "navy", "lime"]
    colour = {method: palette[i % len(palette)] for i, method in enumerate(methods)}
    for (method, where), histories in sorted(groups.items()):
        prefix = f"ens_{split}_" if where == "predictive" else f"{split}_"
        length = min(len(h) for h in histories)
        rounds = [line["round"] for line in histories[0][:length]]
        for ax, (metric, label, scale) in zip(axes, metrics, strict=True):
            series = [[scale * h[i][prefix + metric] for h in histories] for i in range(length)]
            mean = [statistics.fmean(s) for s in series]
            style = "-" if where == "predictive" else "--"
            ax.plot(rounds, mean, label=f"{method} ({where})", color=colour[method], linestyle=style)
            if len(histories) > 1:
                std = [statistics.stdev(s) for s in series]
                ax.fill_between(
                    rounds,
                    [m - s for m, s in zip(mean, std, strict=True)],
                    [m + s for m, s in zip(mean, std, strict=True)],
                    color=colour[method],
                    alpha=0.15,
                )
            ax.set_xlabel("round")
            round_ticks(ax)
            ax.set_ylabel(f"{'validation' if split == 'val' else 'test'} {label}")
            ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
