"""The identity of a `bayesadmm.run` run: what its config.json holds (`run_config`) and what a resume must match
(`check_same_run`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from bayesadmm.engine.identity import RESUME_MAY_CHANGE
from bayesadmm.engine.settings import Settings
from bayesadmm.models import FlatModel

__all__ = ["run_config", "check_same_run"]


def run_config(settings: Settings, algorithm: str, hparams, likelihood, model, flat: FlatModel, sizes) -> dict:
    """The run's identity (`algorithm`: its name), written to config.json and compared on resume (`check_same_run`)."""
    return {
        "settings": {
            k: getattr(settings, k)
            for k in (
                "rounds",
                "seed",
                "participation",
                "eval_samples",
                "device",
                "workers",
                "checkpoint_every",
                "stop_at",
                "cohort",
                "compile",
            )
        },
        "algorithm": algorithm,
        "hparams": {k: _jsonable(v) for k, v in (hparams or {}).items()},
        "likelihood": repr(likelihood),
        "model": repr(model) if isinstance(model, nn.Module) else repr(flat),
        "parameters": flat.dim,
        "clients": {str(k): n for k, n in sizes.items()},
    }


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


def check_same_run(run_dir: Path, config: Mapping[str, Any]) -> None:
    """A resume must continue the same experiment: everything but what a resume may change (`RESUME_MAY_CHANGE`:
    workers, checkpoint_every, stop_at, device, ...) and the dp budget and noise as saved."""
    path = run_dir / "config.json"
    if not (run_dir / "checkpoint.pt").exists() or not path.exists():
        raise FileNotFoundError(f"{run_dir} has no checkpoint to resume from; run without resume=True")
    from bayesadmm.engine.rundir import read_bytes

    saved = json.loads(read_bytes(path))  # never through a link out of the run directory
    saved.get("settings", {}).setdefault("compile", "on")  # written before the setting: it compiled
    mine = json.loads(json.dumps(config))
    for key in RESUME_MAY_CHANGE:  # workers, checkpoint_every, stop_at, device, ...: the same run
        saved.get("settings", {}).pop(key, None)
        mine["settings"].pop(key, None)
    for key in ("dp_epsilon", "dp_noise"):  # a larger budget (or other noise) goes on: the accountant has each round's
        saved.get("dp", {}).pop(key, None)
        mine.get("dp", {}).pop(key, None)
    differ = sorted(k for k in set(saved) | set(mine) if saved.get(k) != mine.get(k))
    if "settings" in differ:  # named one by one: e.g. compile, which a run of an older version left out
        old, new = saved.get("settings", {}), mine["settings"]
        differ = [k for k in differ if k != "settings"] + [
            f"{k}={old.get(k)!r} (now {new.get(k)!r})" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)
        ]
    if differ:
        raise ValueError(
            f"{run_dir} holds a different run (it differs in {', '.join(differ)}); "
            f"resume with the same arguments, or choose another out="
        )
