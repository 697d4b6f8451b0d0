"""The Flower app of the presets (`flwr run APP` for `bayesadmm run`'s scenarios), shipped inside the package as
data: bayesadmm/flower/app/ (in a clone also reachable as flower_app/). It holds only its pyproject.toml, whose
components point to `bayesadmm.flower.server_app` and `bayesadmm.flower.client_app`, so the same app works from a
clone and from an installed wheel."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def preset_app() -> Path:
    """The folder of the presets' Flower app in this installation (found with importlib.resources, so wherever
    bayesadmm is installed). `flwr run` needs a folder on disk: a bayesadmm imported from a zip file has none."""
    app = Path(str(resources.files("bayesadmm.flower") / "app"))
    if not (app / "pyproject.toml").is_file():
        raise FileNotFoundError(f"the presets' Flower app is not on disk at {app} (is bayesadmm installed unpacked?)")
    return app
