"""The table of docs/results/privacy.md from its runs' folders: python scripts/privacy_table.py runs/privacy"""

import json
import sys
from pathlib import Path

COLUMNS = ("test_acc", "test_nll", "test_ece", "ens_test_acc", "ens_test_nll", "ens_test_ece")
RUNS = [(method, level, eps) for method, level in (("fedavg", "client"), ("fedavg", "example"), ("ivon-admm", "client"))
        for eps in ("1", "3", "8", "inf") if not (level == "example" and eps == "inf")]  # fmt: skip


def row(root: Path, method: str, level: str, eps: str) -> str | None:
    """The table's row of one run (None where its folder is missing)."""
    name = f"{method}-inf" if eps == "inf" else f"{method}-{'example-' if level == 'example' else ''}eps{eps}"
    run = root / name
    if not (run / "status.json").exists():
        return None
    status = json.loads((run / "status.json").read_text())
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    dp = "none" if eps == "inf" else level
    if not lines:
        return f"| {method} | {dp} | budget {eps} | | {status['status']} in round {status['round'] + 1} |" + " |" * 6
    last = lines[-1]
    spent = "∞" if "dp_epsilon" not in last else f"{last['dp_epsilon']:.3f}"
    sigma = f"{last['dp_noise_multiplier']:.3f}" if "dp_noise_multiplier" in last else ""
    values = " | ".join(f"{last[k]:.3f}" if k in last else "" for k in COLUMNS)
    return f"| {method} | {dp} | {spent} | {sigma} | {status['status']} (round {last['round']}) | {values} |"


def main(root: Path) -> None:
    print("| method | DP | ε (δ = 1e-5) | σ | status | acc | NLL | ECE | pred. acc | pred. NLL | pred. ECE |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for found in (row(root, *run) for run in RUNS):
        if found is not None:
            print(found)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
