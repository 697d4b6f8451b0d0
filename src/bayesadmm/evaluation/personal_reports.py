"""The personalised comparison of finished runs (`bayesadmm compare`): per method, the global and the personal model
on the clients' own test splits (mean and worst client of accuracy, NLL and ECE, from the metrics line of each
run's last personal evaluation), and a plot of every client's global and personal accuracy per method
(personal.png, from the runs' personal.jsonl).

Rows follow the main table's (`reports`): `(m_g)` at the models' means (a fine-tuned point model, or the mean of a
personal posterior), `(predictive)` for the posterior predictive where the method's posteriors can be sampled; a
value is the mean ± std over the runs (seeds) of a setting.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from bayesadmm.evaluation.diagrams import pyplot
from bayesadmm.evaluation.reports import _finished_runs, setting_labels
from bayesadmm.evaluation.tables import markdown_table

__all__ = ["personal_report", "personal_rows", "last_personal", "plot_personal", "COLUMNS"]

# (metric, column label, scale): accuracy in per cent
COLUMNS = (("acc", "accuracy (%)", 100.0), ("nll", "NLL", 1.0), ("ece", "ECE", 1.0))
MODELS = ("global", "personal")


def last_personal(history: Sequence[Mapping]) -> Mapping | None:
    """The metrics line of a run's last personal evaluation (None: the run evaluated none)."""
    lines = [line for line in history if "personal_acc_mean" in line or "personal_nll_mean" in line]
    return lines[-1] if lines else None


def personal_rows(runs: Sequence) -> tuple[list[str], list[list[str]]]:
    """The personalised table's header and rows: per setting and (m_g | predictive), each metric's mean and worst
    client as "global → personal", mean over the runs (± std over them where there are several)."""
    groups: dict[tuple[str, str], list[Mapping]] = defaultdict(list)
    rounds: dict[str, set] = defaultdict(set)
    for run, label in zip(runs, setting_labels([run.config for run in runs]), strict=True):
        line = last_personal(run.history)
        if line is None:
            continue
        rounds[label].add(line["round"])
        groups[(label, "m_g")].append(line)
        if "ens_personal_acc_mean" in line or "ens_personal_nll_mean" in line:
            groups[(label, "predictive")].append(line)
    header = ["method", "runs", "round"]
    header += [f"{name} {stat} (global → personal)" for _, name, _ in COLUMNS for stat in ("mean", "worst")]
    rows = []
    for (label, where), lines in sorted(groups.items()):
        prefix = "ens_" if where == "predictive" else ""
        cells = [f"{label} ({where})", str(len(lines)), ",".join(str(r) for r in sorted(rounds[label]))]
        for metric, _, scale in COLUMNS:
            for stat in ("mean", "worst"):
                pair = [
                    _cell(lines, f"{prefix}{model}_{metric}_{stat}", scale, metric) for model in ("global", "personal")
                ]
                cells.append(" → ".join(pair))
        rows.append(cells)
    return header, rows


def _cell(lines: Sequence[Mapping], key: str, scale: float, metric: str) -> str:
    values = [scale * line[key] for line in lines if key in line]
    if not values:
        return "—"
    digits = 1 if metric == "acc" else 3
    text = f"{statistics.fmean(values):.{digits}f}"
    return text + (f" ± {statistics.stdev(values):.{digits}f}" if len(values) > 1 else "")


def _client_accuracies(run_dir: Path) -> dict[str, tuple[list[int], list[float], list[float]]] | None:
    """The last line of a run folder's personal.jsonl as (client ids, global accuracies, personal accuracies) at the
    models' means; None where the folder has none."""
    path = Path(run_dir) / "personal.jsonl"
    if not path.is_file():
        return None
    lines = [json.loads(text) for text in path.read_text().splitlines() if text.strip()]
    if not lines:
        return None
    clients = lines[-1]["clients"]
    ids = sorted(clients, key=int)
    if not all("acc" in clients[k]["global"] for k in ids):
        return None
    return {
        "clients": ([int(k) for k in ids], [clients[k]["global"]["acc"] for k in ids],
                    [clients[k]["personal"]["acc"] for k in ids]),
    }  # fmt: skip


def plot_personal(runs: Sequence, path: Path) -> bool:
    """personal.png: one panel per method (its first run with a personal.jsonl), each client's accuracy on its own
    test split for the global and the personal model, at their means. False where no run has per-client data."""
    found = {}
    for run, label in zip(runs, setting_labels([run.config for run in runs]), strict=True):
        if label not in found and (data := _client_accuracies(Path(run.name))) is not None:
            found[label] = data["clients"]
    if not found:
        return False
    plt = pyplot()
    fig, axes = plt.subplots(1, len(found), figsize=(4.2 * len(found), 3.4), layout="constrained", squeeze=False)
    for ax, (label, (ids, global_acc, personal_acc)) in zip(axes[0], sorted(found.items()), strict=True):
        positions = range(len(ids))
        ax.bar([p - 0.2 for p in positions], [100 * a for a in global_acc], width=0.4, label="global")
        ax.bar([p + 0.2 for p in positions], [100 * a for a in personal_acc], width=0.4, label="personal")
        ax.set_xticks(list(positions), [str(k) for k in ids], fontsize=7)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("client")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel("accuracy on the client's split (%)")
    axes[0][0].legend(fontsize=8, loc="lower left")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def personal_report(
    sources: Sequence[Path], out_dir: Path | None = None, only: Mapping[str, Sequence[str]] | None = None
) -> str | None:
    """The personalised table (Markdown) of the runs in `sources` that evaluated personal models, written with
    `out_dir` to personal.md, with personal.png (`plot_personal`); None where no run did."""
    runs, _ = _finished_runs(sources, only)
    runs = [run for run in runs if last_personal(run.history) is not None]
    if not runs:
        return None
    markdown = markdown_table(*personal_rows(runs))
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "personal.md").write_text(markdown + "\n")
        plot_personal(runs, Path(out_dir) / "personal.png")
    return markdown
