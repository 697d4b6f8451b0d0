"""The presets' Flower app ships inside the package and is found with importlib.resources (not relative to a clone):
`bayesadmm flower demo` and `bayesadmm flower resume` use it; the repository's flower_app/ is a link to it."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from bayesadmm.flower.preset import preset_app  # noqa: E402
from bayesadmm.flower.resume import resume_argv  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_the_preset_app_is_package_data_and_the_clone_links_to_it():
    app = preset_app()
    assert app == ROOT / "src" / "bayesadmm" / "flower" / "app"
    components = tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["components"]
    assert set(components) == {"serverapp", "clientapp"}
    assert (ROOT / "flower_app").resolve() == app


def test_resuming_a_preset_run_names_the_shipped_app(tmp_path):
    (tmp_path / "flower.json").write_text(json.dumps({"scenario": "fmnist-heterog10"}))
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    assert resume_argv(tmp_path, "mylink")[1:3] == ["run", str(preset_app())]
