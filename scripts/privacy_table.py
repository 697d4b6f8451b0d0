"""The tables of docs/results/privacy.md from its runs' folders: python scripts/privacy_table.py runs/privacy

Each row: the run's ε spent and noise multiplier, its status and its test metrics after the last round (or the round
named), and for a Gaussian posterior the median of its precision over the parameters (from posterior.safetensors)."""

import json
import math
import sys
from pathlib import Path

from safetensors.torch import load_file

COLUMNS = ("test_acc", "test_nll", "test_ece", "ens_test_acc", "ens_test_nll", "ens_test_ece")
HEADER = (
    "| method | DP | ε (δ = 1e-5) | σ | status | acc | NLL | ECE | pred. acc | pred. NLL | pred. ECE "
    "| median precision |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
)
# (run folder, what the row calls the method, DP, the round whose metrics the row shows: None for the last)
CLIENT_LEVEL = [(f"{m}-eps{e}", m, "client", None) for m in ("fedavg", "ivon-admm") for e in (1, 3, 8)] + [
    *[(f"ivon-admm-participants-eps{e}", "ivon-admm, proximal=participants", "client", None) for e in (1, 3, 8)],
    ("fedavg-inf", "fedavg", "none", None),
    ("ivon-admm-inf", "ivon-admm", "none", None),
]
EXAMPLE_LEVEL = (
    [(f"{m}-example-eps{e}", m, "example", None) for m in ("fedavg", "ivon-admm") for e in (1, 3, 8)]
    + [("fedavg-inf-example", "fedavg", "none", None), ("ivon-admm-inf-example", "ivon-admm", "none", None)]
    + [
        ("ivon-admm-beta2-example-eps8", "ivon-admm, β₂ = 0.99999", "example", None),
    ]
)
# fmnist-xdevice (runs/privacy-xdevice): 10⁴ clients, Poisson rate q = 0.01 unless the run's name says another
XDEVICE = (
    [(f"fedavg-eps{e}", "fedavg", "client", None) for e in (1, 3, 8)]
    + [("ivon-admm-eps8", "ivon-admm", "client", None)]
    + [(f"{m}-inf", m, "none", None) for m in ("fedavg", "ivon-admm")]
)
PARTICIPATION = [
    (f"{m}-{run}" + ("" if q == 0.01 else f"-p{q}"), f"{m}, q = {q} ({q * 10_000:g} a round)", dp, None)
    for m in ("fedavg",)
    for q in (0.005, 0.01, 0.02, 0.05)
    for run, dp in (("eps8", "client"), ("inf", "none"))
]
TABLES = {
    "client": ("client level, 10 rounds", CLIENT_LEVEL),
    "example": ("example level, 10 rounds", EXAMPLE_LEVEL),
    "xdevice": ("fmnist-xdevice, client level, 50 rounds, q = 0.01", XDEVICE),
    "participation": ("fmnist-xdevice, client level, 50 rounds, ε = 8 against clients a round", PARTICIPATION),
}


def median_precision(run: Path) -> str:
    """The median over the parameters of a Gaussian posterior's precision (−2 × its second natural parameter)."""
    path = run / "posterior.safetensors"
    if not path.exists():
        return ""
    tensors = load_file(str(path))
    if "natural.1" not in tensors:
        return ""
    return f"{float((-2 * tensors['natural.1'].double()).median()):.3g}"


def row(root: Path, name: str, method: str, dp: str, at: int | None) -> str | None:
    """The table's row of one run (None where its folder is missing)."""
    run = root / name
    if not (run / "status.json").exists():
        return None
    status = json.loads((run / "status.json").read_text())
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    lines = [line for line in lines if at is None or line["round"] <= at]
    if not lines:
        budget = name.rsplit("eps", 1)[-1]
        return f"| {method} | {dp} | budget {budget} | | {status['status']} in round {status['round'] + 1} |" + " |" * 7
    last = lines[-1]
    spent = "∞" if last.get("dp_epsilon", math.inf) == math.inf else f"{last['dp_epsilon']:.3f}"
    sigma = f"{last['dp_noise_multiplier']:.3f}" if "dp_noise_multiplier" in last else ""
    state = f"round {last['round']}" if at is not None else f"{status['status']} (round {last['round']})"
    values = " | ".join(f"{last[k]:.3f}" if k in last else "" for k in COLUMNS)
    return f"| {method} | {dp} | {spent} | {sigma} | {state} | {values} | {median_precision(run)} |"


def client_sizes(root: Path) -> str:
    """The smallest and largest client of the runs' federation (the first run's partition.json)."""
    for partition in sorted(root.glob("*/partition.json")):
        sizes = [len(ids) for ids in json.loads(partition.read_text())["clients"]]
        return f"{len(sizes)} clients of {min(sizes)} to {max(sizes)} examples"
    return "no partition.json"


def median_norms(root: Path) -> str:
    """`dp_median_norm` (and `dp_median_precision_norm` where there is one) of round 1 of the runs without noise
    (the *-norms folders, or *-inf ones run with dp_noise=0): the clips' scale."""
    found = []
    for run in sorted([*root.glob("*-norms"), *root.glob("*-inf")]):
        lines = (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").exists() else []
        first = json.loads(lines[0]) if lines else {}
        if "dp_median_norm" in first:
            precision = first.get("dp_median_precision_norm", 0.0)
            found.append(
                f"{run.name.removesuffix('-norms').removesuffix('-inf')} {first['dp_median_norm']:.3g}"
                + (f" (precision half {precision:.3g})" if precision else "")
            )
    return "median update norm in round 1 without noise: " + (", ".join(found) or "no such runs")


def main(root: Path, levels: list[str]) -> None:
    print(f"{client_sizes(root)}; {median_norms(root)}\n")
    for level in levels:
        title, runs = TABLES[level]
        print(f"{title}:\n\n{HEADER}")
        for found in (row(root, *run) for run in runs):
            if found is not None:
                print(found)
        print()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:] or list(TABLES))
