"""The README's Python examples run as written (in a temporary folder, so their run directories go there)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_python_examples():
    assert BLOCKS, "README.md has no ```python blocks"


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[index], f"README.md block {index}", "exec"), {"__name__": "__readme__"})
    if "quickstart" in BLOCKS[index]:
        accuracy = float(capsys.readouterr().out.strip().splitlines()[-1])
        assert accuracy > 0.8   # it learns: 0.93 on this seed (3 classes, chance 0.33)
        assert (tmp_path / "runs" / "quickstart" / "curves.png").exists()
