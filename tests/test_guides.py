"""The user guides' Python snippets run as written, in order, in one namespace per guide (a later snippet may use
what an earlier one made), in a temporary folder so that their run directories go there."""

import re
from pathlib import Path

import pytest

GUIDES = Path(__file__).resolve().parents[1] / "docs" / "guides"
EXECUTED = ("posterior.md",)  # the guides whose snippets are complete programs


def blocks(name: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (GUIDES / name).read_text(), flags=re.S)


@pytest.mark.parametrize("name", EXECUTED)
def test_guide_snippets_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    found = blocks(name)
    assert found, f"{name} has no ```python blocks"
    namespace = {"__name__": "__guide__"}
    for index, block in enumerate(found):
        exec(compile(block, f"{name} block {index}", "exec"), namespace)
