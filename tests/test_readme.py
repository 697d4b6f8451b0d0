"""The README's Python examples run as written (in a temporary folder, so their run directories go there), and the
progress log the README and Getting started show after the quickstart is the one it writes where stderr is not a
terminal."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
GETTING_STARTED = README.parent / "docs" / "getting-started.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def _log_after_quickstart(path: Path) -> tuple[str, list[str]]:
    """The quickstart's code in `path` and the first ```text block after it (the log shown for it)."""
    found = re.search(r"```python\n(.*?)```.*?```text\n(.*?)```", path.read_text(), flags=re.S)
    assert found and "quickstart" in found.group(1), f"{path.name}: no quickstart followed by its log"
    return found.group(1), found.group(2).splitlines()


def _shape(lines: list[str]) -> list[str]:
    """A progress log's lines with what the machine and the dtype change blanked: accuracies and seconds."""
    lines = [re.sub(r"\d+\.\d%", "A%", line) for line in lines]
    return [re.sub(r"\d+ s\b", "S s", line) for line in lines]


def _code(text: str) -> str:
    """Python code without its comments and whitespace: the same program however it is laid out."""
    return re.sub(r"\s+", "", re.sub(r"#[^\n]*", "", text))


def _contiguous(part: list[str], whole: list[str]) -> bool:
    return any(whole[i : i + len(part)] == part for i in range(len(whole) - len(part) + 1))


def test_the_readme_has_python_examples():
    assert BLOCKS, "README.md has no ```python blocks"


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[index], f"README.md block {index}", "exec"), {"__name__": "__readme__"})
    if "quickstart" in BLOCKS[index]:
        captured = capsys.readouterr()
        accuracy = float(captured.out.strip().splitlines()[-1])
        assert accuracy > 0.8  # it learns: 0.93 on this seed (3 classes, chance 0.33)
        assert (tmp_path / "runs" / "quickstart" / "curves.png").exists()
        # stderr here is not a terminal: the log the pages show (their numbers are a float32 run's, these float64's)
        log = _shape(captured.err.strip().splitlines())
        for page in (README, GETTING_STARTED):
            code, shown = _log_after_quickstart(page)
            assert _code(code) == _code(BLOCKS[index]), f"{page.name}'s quickstart is not the README's"
            assert shown and _contiguous(_shape(shown), log), (page.name, shown, captured.err)
