"""The built wheel is complete outside a clone: installed into a fresh virtual environment and used from a folder
outside the repository, it runs the README's quickstart, `bayesadmm --version`, `bayesadmm flower demo --help` and
a sweep shipped with it by name (`bayesadmm sweep @diabetes-iid5-smoke`), and it carries py.typed, the sweep files,
the scenario files and the presets' Flower app.

How the fresh environment gets its dependencies: installing torch, flwr and the rest from the package registry would
take minutes (and CI has only the registry it is configured with), so the new venv (``--without-pip``) gets this
environment's site-packages appended to its sys.path by a ``.pth`` file. The lines of a ``.pth`` file only extend
sys.path (the ``.pth`` files found there, among them the editable install's, are not processed), and the venv's own
site-packages comes first, so ``import bayesadmm`` finds the wheel's copy, installed with ``pip install --no-deps``:
the test checks ``bayesadmm.__file__`` and that no source tree is on the path. The wheel is built without build
isolation (this environment's setuptools) from a copy of the project, so the checkout is left as it was.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # builds a wheel, makes a venv and runs two short federated jobs: about 40 s


def _run(argv: list, cwd: Path, env: dict, timeout: float = 300) -> str:
    """Run a command; its standard output, or a failure that shows both outputs."""
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv} exited with {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _build_wheel(tmp_path: Path) -> Path:
    """The wheel of a copy of the project (pyproject.toml, README.md, LICENSE, src/)."""
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, project / name)
    shutil.copytree(ROOT / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist, project], tmp_path, os.environ)
    (wheel,) = dist.glob("bayesadmm-*.whl")
    return wheel


def _fresh_venv(tmp_path: Path, wheel: Path) -> tuple[Path, dict]:
    """A new venv with the wheel installed (no dependencies) and this environment's packages behind it; its bin
    folder and the environment to run its commands in (no PYTHONPATH: nothing of the checkout on the path)."""
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, os.environ)
    python = venv / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path, {}).strip())
    (site / "_bayesadmm_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "--quiet", wheel]
    _run(pip, tmp_path, os.environ)
    # a user's environment: nothing of the checkout (PYTHONPATH) and none of the library's settings of this process
    dropped = ("PYTHONPATH", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("BAYESADMM_")}
    env.update(BAYESADMM_COMPILE="0", BAYESADMM_WORKERS="1", PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    return venv / "bin", env


def test_the_wheel_works_outside_a_clone(tmp_path):
    wheel = _build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in ("bayesadmm/py.typed", "bayesadmm/flower/app/pyproject.toml", "bayesadmm/sweeps/diabetes-iid5.json",
                    "bayesadmm/experiments/scenarios/diabetes-iid5.json"):
        assert shipped in names, shipped
    bin_dir, env = _fresh_venv(tmp_path, wheel)
    elsewhere = tmp_path / "elsewhere"  # outside the repository: no flower_app/, sweeps/ or src/ next to it
    elsewhere.mkdir()

    where = _run(
        [bin_dir / "python", "-c", "import bayesadmm, sys, json; print(json.dumps([bayesadmm.__file__, sys.path]))"],
        elsewhere,
        env,
    )
    module, path = json.loads(where)
    assert Path(module).is_relative_to(tmp_path / "venv"), module
    others = [e for e in path if e and not Path(e).is_relative_to(tmp_path / "venv")]
    assert not [e for e in others if (Path(e) / "bayesadmm" / "__init__.py").is_file()], "a source tree on the path"

    version = _run([bin_dir / "bayesadmm", "--version"], elsewhere, env)
    assert version.strip() == "bayesadmm 0.1.0"
    assert "--supernodes" in _run([bin_dir / "bayesadmm", "flower", "demo", "--help"], elsewhere, env)
    find_app = "from bayesadmm.flower.preset import preset_app; print(preset_app())"
    app = _run([bin_dir / "python", "-c", find_app], elsewhere, env)
    assert Path(app.strip()).is_relative_to(tmp_path / "venv") and (Path(app.strip()) / "pyproject.toml").is_file()

    quickstart = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)[0]
    (elsewhere / "quickstart.py").write_text(quickstart)
    accuracy = float(_run([bin_dir / "python", "quickstart.py"], elsewhere, env).strip().splitlines()[-1])
    assert accuracy > 0.8
    assert (elsewhere / "runs" / "quickstart" / "metrics.jsonl").is_file()

    sweep = [bin_dir / "bayesadmm", "sweep", "@diabetes-iid5-smoke", "--out", "smoke", "--rounds", "3", "--quiet"]
    table = _run(sweep, elsewhere, env)
    assert "runs: 2 completed" in table and "ivon-admm (predictive)" in table
    assert sorted(p.name for p in (elsewhere / "smoke").glob("method=*")) == ["method=fedavg", "method=ivon-admm"]
