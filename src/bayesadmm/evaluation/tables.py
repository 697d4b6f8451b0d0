"""The text of a comparison table: its cells ("mean ± std" over runs) as Markdown and as LaTeX."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def mean_std(values: Sequence[float], scale: float, digits: int) -> str:
    """A cell: "mean ± std" over the runs, or the value alone where one run has it (a std of one run is no spread)."""
    mean = scale * statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {scale * statistics.stdev(values):.{digits}f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table of `header` and `rows`."""
    return "\n".join(
        ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(row) + " |" for row in rows]
    )


def latex(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A booktabs tabular of `header` and `rows` (± as $\\pm$, %, _ escaped, @ dropped)."""

    def esc(text: str) -> str:
        return text.replace("±", r"$\pm$").replace("%", r"\%").replace("_", r"\_").replace("@", "")

    lines = [
        r"\begin{tabular}{l" + "r" * (len(header) - 1) + "}",
        r"\toprule",
        " & ".join(esc(h) for h in header) + r" \\",
        r"\midrule",
    ]
    lines += [" & ".join(esc(c) for c in row) + r" \\" for row in rows]
    lines += [r"\bottomrule", r"\end{tabular}", ""]
    return "\n".join(lines)
