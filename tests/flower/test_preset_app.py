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


@pytest.mark.parametrize("app", ["src/bayesadmm/flower/app", "examples/flower", "examples/flower-app"])
def test_every_key_a_shipped_app_declares_is_one_its_server_reads(app):
    """Each shipped app's run config, flattened as Flower flattens it (``[...config.fedavg] lr`` is ``fedavg.lr``),
    passes the check a ServerApp makes of it: bayesadmm's ServerApp (`app_config`) or, for the app of one's own
    (examples/flower-app), `strategy_from_config`'s."""
    from flwr.common.config import flatten_dict

    from bayesadmm.flower.app_config import KEYS, refusal
    from bayesadmm.flower.strategies import READ_KEYS

    project = tomllib.loads((ROOT / app / "pyproject.toml").read_text())
    run_config = flatten_dict(project["tool"]["flwr"]["app"]["config"])
    own = "bayesadmm.flower" not in project["tool"]["flwr"]["app"]["components"]["serverapp"]
    if own:
        assert refusal(run_config, READ_KEYS, str(run_config["method"])) == ""
    else:
        preset = not run_config.get("model")
        method = str(run_config.get("method" if preset else "algorithm") or "")
        assert refusal(run_config, KEYS, method, preset=preset) == ""
    assert not str(run_config.get("likelihood", "")).startswith("regression:")
