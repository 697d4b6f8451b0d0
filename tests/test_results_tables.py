"""scripts/results_tables.py: the results pages quote generated tables verbatim, a missing one is an error,
and every table kept in docs/results is what `compare` makes from the runs kept beside it."""

import importlib.util
from pathlib import Path

import pytest

from bayesadmm.evaluation.personal_reports import personal_report
from bayesadmm.evaluation.reports import compare

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "results_tables.py"


def _script():
    spec = importlib.util.spec_from_file_location("results_tables", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _embed():
    return _script().embed


def test_the_kept_tables_are_what_compare_makes_of_the_kept_runs():
    script = _script()
    found = script.tables()
    assert len(found) >= 15
    for runs, rounds, paper in found:
        written = (runs.parent / "table.md").read_text().rstrip("\n")
        if paper:
            written += "\n\n" + (runs.parent / "paper.md").read_text().rstrip("\n")
        assert compare([runs], rounds, paper=paper) == written, runs
        if (runs.parent / "personal.md").exists():
            assert personal_report([runs]) == (runs.parent / "personal.md").read_text().rstrip("\n"), runs
    assert [page.name for page in script.pages()] == ["README.md", "diabetes.md", "mnist.md", "personal.md", "privacy.md", "uncertainty.md", "unlearning.md"]
    for page in script.pages():
        for match in script.BLOCK.finditer(page.read_text()):  # the pages quote those files as they are
            quoted = (page.parent / match.group("path")).read_text()
            assert match.group("body") == quoted.rstrip("\n") + "\n", match.group("path")
            # the stylesheet's results-table class: numbers unbroken, the page's other tables wrap
            before = page.read_text()[: match.start()]
            assert before.endswith('<div class="results-table" markdown>\n\n'), match.group("path")


def test_blocks_get_the_current_file_and_the_rest_is_untouched(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "table.md").write_text("| a | b |\n|---|---|\n| 1 | 2 |\n")
    page = tmp_path / "README.md"
    page.write_text("intro\n<!-- include: s/table.md -->\nstale table\n<!-- end include -->\nafter\n"
                    "<!-- include: s/table.md -->\n<!-- end include -->\n")
    assert _embed()(page) == 2
    block = "<!-- include: s/table.md -->\n| a | b |\n|---|---|\n| 1 | 2 |\n<!-- end include -->\n"
    assert page.read_text() == "intro\n" + block + "after\n" + block
    assert _embed()(page) == 2 and page.read_text() == "intro\n" + block + "after\n" + block   # idempotent


def test_a_missing_table_is_an_error(tmp_path):
    page = tmp_path / "README.md"
    page.write_text("<!-- include: nowhere.md -->\nold\n<!-- end include -->\n")
    with pytest.raises(FileNotFoundError, match="nowhere.md"):
        _embed()(page)
    assert "old" in page.read_text()
