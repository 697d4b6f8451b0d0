"""scripts/embed_tables.py: the results page quotes generated tables verbatim and refuses to quote a missing one."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "embed_tables.py"


def _embed():
    spec = importlib.util.spec_from_file_location("embed_tables", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.embed


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
