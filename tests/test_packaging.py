"""The release artefacts: `python -m build` makes a wheel and an sdist that install in a fresh virtual environment
and give a working `bayesadmm --help`, with the licence and the package data inside."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import venv
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parents[1]

pytest.importorskip("build")


def _run(*command, cwd: Path | None = None) -> str:
    # a clean environment, outside the checkout: what other tests of the session left in os.environ (Ray sets
    # PYTHONPATH) or the working directory must not put this checkout's sources before the installed artefact
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    done = subprocess.run(
        command, cwd=cwd or tempfile.gettempdir(), env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
def test_the_wheel_and_the_sdist_install_and_run(tmp_path):
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT))
    wheel, sdist = next(dist.glob("*.whl")), next(dist.glob("*.tar.gz"))
    names = zipfile.ZipFile(wheel).namelist()
    assert any(name.endswith("licenses/LICENSE") for name in names)
    scenarios = ROOT / "src" / "bayesadmm" / "experiments" / "scenarios"
    assert {f"bayesadmm/experiments/scenarios/{f.name}" for f in scenarios.glob("*.json")} <= set(names)
    dependencies = Path(torch.__file__).parents[1]  # this environment's site-packages: torch, numpy, matplotlib
    for artefact in (wheel, sdist):
        env = tmp_path / f"venv-{artefact.suffix}"
        venv.create(env, with_pip=True)
        python = str(env / "bin" / "python")
        _run(python, "-m", "pip", "install", "--quiet", "--no-deps", str(artefact))
        # the dependencies are found after the fresh environment's own packages (no multi-GB torch download here)
        site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
        (site / "dependencies.pth").write_text(f"{dependencies}\n")
        where = _run(python, "-c", "import bayesadmm; print(bayesadmm.__file__)")
        assert where.startswith(str(env)), where  # the installed artefact, not this checkout
        assert "run a federated experiment" in _run(str(env / "bin" / "bayesadmm"), "--help")
