"""The example apps keep their runs out of the app Flower sends: a run started from the app folder writes its run
directory there (out= defaults to runs/...), and each app's .gitignore names runs/, which Flower leaves out of its copy
of the app (the FAB `flwr run .` builds)."""

from __future__ import annotations

import io
import shutil
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from flwr.cli.build import build_fab_from_disk  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _fab_files(app: Path) -> list[str]:
    return zipfile.ZipFile(io.BytesIO(build_fab_from_disk(app))).namelist()


@pytest.mark.parametrize("name", ["flower-app", "flower"])
def test_an_example_apps_runs_are_not_sent_with_the_app(tmp_path, name):
    app = tmp_path / name
    shutil.copytree(ROOT / "examples" / name, app)
    run = app / "runs" / "flower-20261202-120000"
    run.mkdir(parents=True)
    for file in ("config.json", "metrics.jsonl", "flower.json"):
        (run / file).write_text("{}\n")
    assert not [path for path in _fab_files(app) if path.startswith("runs/")]
    (app / ".gitignore").unlink()  # without it, Flower would send them (json and jsonl are among its app files)
    assert [path for path in _fab_files(app) if path.startswith("runs/")]
