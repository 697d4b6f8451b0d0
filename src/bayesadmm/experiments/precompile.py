"""Compile the fused kernels of a scenario's runs ahead of them, into torch's on-disk compilation cache.

The first call of each compiled kernel (`optim.kernels`) in a process runs torch.compile; on an empty cache that is
seconds per kernel variant, ~15 s before a run's first client has trained. With the compiled code in the on-disk
cache (Inductor's cache directory, $TORCHINDUCTOR_CACHE_DIR or /tmp/torchinductor_<user>) a later process only
traces and loads it. `precompile` fills that cache the way the runs themselves would: it runs each of the scenario's
methods whose runs call compiled kernels (IVON's solver, where the scenario's run with `compile=auto` compiles:
`algorithms.base.compiled_kernels`; the others are skipped, and say why) for two rounds of one epoch on a small part
of the scenario's data and model with `compile=on`, one client at a time and in cohorts, then a few steps of the
drop-in optimizer `optim.IVON` on the scenario's model. Running the real code paths, not calls of each kernel with
made-up arguments, is what makes every variant torch.compile tells apart (shapes of size 1, views of a cohort's
matrices) the one a run will ask for. Kernels compiled with dynamic shapes serve any model and client size.

`make setup` runs it (`bayesadmm precompile`); it records what it compiled in the cache directory, so it is done once
per cache, kernel source and torch version, and a cache that was emptied is filled again.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

import bayesadmm
from bayesadmm.algorithms.base import compiled_kernels
from bayesadmm.experiments.build import build, run
from bayesadmm.experiments.config import method_parameters, presets, resolve
from bayesadmm.optim import IVON, kernels

MARKS = "bayesadmm-precompiled"  # the folder of marks in the cache directory


def cache_directory() -> Path:
    """Inductor's on-disk cache directory (where the compiled kernels go)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir())


# The sources that make the kernels and call them: a change to one of them may change what is compiled.
SOURCES = ("rng.py", "optim/*.py", "solvers/*.py")


def _mark(scenario: str, methods: Sequence[str], cohorts: Sequence[int], fraction: float) -> Path:
    """The file recording that this precompile was done: named by the torch version, the `SOURCES` and the
    arguments, so that a change to any of them compiles again."""
    digest = hashlib.sha256(f"{torch.__version__}|{scenario}|{list(methods)}|{list(cohorts)}|{fraction}".encode())
    package = Path(bayesadmm.__file__).parent
    for source in sorted(path for pattern in SOURCES for path in package.glob(pattern)):
        digest.update(source.relative_to(package).as_posix().encode())
        digest.update(source.read_bytes())
    return cache_directory() / MARKS / digest.hexdigest()[:32]


def precompile(
    scenario: str = "fmnist-heterog10",
    *,
    methods: Sequence[str] | None = None,
    cohorts: Sequence[int] = (0, 4),
    data_fraction: float = 0.01,
    data_dir: str | None = None,
    force: bool = False,
    report: Callable[[str], None] = print,
) -> bool:
    """Compile the kernels `scenario`'s runs use into the on-disk cache; False where there was nothing to do (done
    before for this cache, source and torch, or compiling switched off with BAYESADMM_COMPILE=0).

    methods: the methods to run (default: the scenario preset's, of which those whose runs compile); cohorts: the
    `cohort` settings to run each with (0: the engine's choice for the device and method, `automatic_cohort`; K >= 2:
    cohorts of K); data_fraction: the part of the scenario's training set the short runs use; data_dir: where the
    dataset's files are (default: the scenario's).
    """
    if not kernels.compile_enabled():
        report("precompile: compiling is switched off (BAYESADMM_COMPILE=0); nothing to do")
        return False
    names = list(methods) if methods is not None else list(presets().get(scenario, {}).get("methods", {}))
    mark = _mark(scenario, names, cohorts, data_fraction)
    if mark.exists() and not force:
        report(f"precompile: the kernels of {scenario} are in {cache_directory()} already")
        return False
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bayesadmm-precompile-") as scratch:
        model, clients = None, None
        where = [f"data_dir={data_dir}"] if data_dir else []
        for method in names:
            full = build(resolve(scenario, [f"method={method}", *where])[0])  # the scenario's run as it would run
            model, clients = full.federation.model, full.federation.clients
            compiled = compiled_kernels(full.algorithm())
            if not compiled:
                why = "compile=auto runs it eagerly" if compiled is False else "its solver has no compiled kernels"
                report(f"precompile: {method}: skipped ({why})")
                continue
            overrides = [f"method={method}", "rounds=2", f"data_fraction={data_fraction}", "workers=1", "compile=on"]
            overrides += where + (["epochs=1"] if "epochs" in method_parameters(method) else [])
            for cohort in cohorts:
                start = time.perf_counter()
                out = Path(scratch) / f"{method}-{cohort}"
                config, _ = resolve(scenario, [*overrides, f"cohort={cohort}", f"out={out}"])
                run(config, progress=False)
                report(f"precompile: {method}, cohort={cohort}: {time.perf_counter() - start:.1f} s")
        if model is not None:
            start = time.perf_counter()
            _step_optimizer(model.build(), clients)
            report(f"precompile: optim.IVON: {time.perf_counter() - start:.1f} s")
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.write_text(f"{scenario} {names} cohorts {list(cohorts)}\n")
    report(f"precompile: done in {time.perf_counter() - began:.1f} s; the kernels are in {cache_directory()}")
    return True


def _step_optimizer(module: torch.nn.Module, clients) -> None:
    """A few steps of the drop-in optimizer, with its defaults, on a batch of the training set."""
    X, y = clients.X[:32], clients.y[:32]
    optimizer = IVON(module.parameters(), lr=1e-3, ess=len(y))
    for _ in range(3):
        with optimizer.sampled_params(train=True):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(module(X), y).backward()
        optimizer.step()
