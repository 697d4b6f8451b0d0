"""Rebuild every table and plot of docs/results from the runs kept there, then refresh the tables its page quotes.

    python scripts/results_tables.py          # or: make results-tables

Each table folder holds the runs behind it as one runs.jsonl (written by `bayesadmm compare --out`); `compare` is
run on it again with the table's rounds (and the papers' numbers for the test-set tables), rewriting table.md,
paper.md and curves.png (and personal.md, for runs with a personal split). Then every block of the pages in
docs/results (README.md, diabetes.md, personal.md, uncertainty.md, unlearning.md) of the form

    <!-- include: fmnist-heterog10/paper.md -->
    ...anything...
    <!-- end include -->

gets, between its two markers, the current content of the named file, so the page shows exactly what `compare`
wrote. A missing file is an error: the page must not quote a table that no command wrote. Each block sits in a
`<div class="results-table" markdown>`, which docs/stylesheets/extra.css keeps numbers unbroken in.
"""

from __future__ import annotations

import re
from pathlib import Path

from bayesadmm.evaluation.personal_reports import personal_report
from bayesadmm.evaluation.reports import compare

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
SCENARIOS = (
    "fmnist-heterog10", "fmnist-homog10", "fmnist-heterog100", "mnist-heterog100", "mnist-homog10", "mnist-heterog10",
)  # fmt: skip
# the papers' rounds where they are not 10, 25, 50 (Table 2: 25, 50, 100; the FedLap paper's homogeneous rows: 10, 20)
PAPER_ROUNDS = {"mnist-heterog100": [25, 50, 100], "mnist-homog10": [10, 20]}
# the selections on the validation split end early (stop_at): their tables stop there
SELECTION_ROUNDS = {"select-ivon-lr": [5, 10], "select-fedlap-func-tau": [5, 10], "select-fedlap-func": [10, 25]}
# tables of shortened runs (rounds=20: docs/results/personal.md, uncertainty.md), beside no published numbers
SHORT_ROUNDS = {**SELECTION_ROUNDS, "personal": [10, 20], "uncertainty": [20]}
BLOCK = re.compile(r"(<!-- include: (?P<path>[^ ]+) -->\n)(?P<body>.*?)(<!-- end include -->)", re.DOTALL)


def tables(root: Path = RESULTS) -> list[tuple[Path, list[int], str | None]]:
    """Each kept runs.jsonl with its table's rounds and the scenario whose published numbers it sits beside."""
    found = []
    for runs in sorted(root.glob("**/runs.jsonl")):
        folder = runs.parent
        short = SHORT_ROUNDS.get(folder.parent.name)
        paper = folder.name if folder.name in SCENARIOS and not short else None
        found.append((runs, short or PAPER_ROUNDS.get(folder.name, [10, 25, 50]), paper))
    return found


def rebuild_tables(root: Path = RESULTS) -> int:
    for runs, rounds, paper in tables(root):
        compare([runs], rounds, out_dir=runs.parent, paper=paper)
        personal_report([runs], out_dir=runs.parent)  # personal.md where the runs evaluated personal models
    return len(tables(root))


def embed(page: Path) -> int:
    text = page.read_text()
    count = 0

    def replace(match: re.Match) -> str:
        nonlocal count
        source = page.parent / match.group("path")
        if not source.is_file():
            raise FileNotFoundError(f"{page}: {source} (quoted by an include block) does not exist")
        count += 1
        return match.group(1) + source.read_text().rstrip("\n") + "\n" + match.group(4)

    page.write_text(BLOCK.sub(replace, text))
    return count


def pages(root: Path = RESULTS) -> list[Path]:
    """The results pages: the Markdown files directly in docs/results (a table folder's table.md is not one)."""
    return sorted(root.glob("*.md"))


if __name__ == "__main__":
    print(f"{rebuild_tables()} tables rebuilt")
    for page in pages():
        print(f"{embed(page)} quoted in {page}")
