"""The identity of a `bayesadmm.run` run: what its config.json holds (`run_config`), which the checkpoint records and a
resume must match (`engine.identity.check_same_run`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from torch import nn

from bayesadmm.algorithms.spec import MethodSpec, get
from bayesadmm.engine.settings import Settings
from bayesadmm.models import FlatModel

__all__ = ["run_config", "recorded_hparams"]


def recorded_hparams(algorithm: Any, hparams: Mapping[str, Any] | None) -> dict[str, Any]:
    """The hyperparameters a run records: for a registered method (its name or spec) every one of them, defaults
    included (`MethodSpec.resolved`), so that a resume or a load never takes a later version's defaults; for a factory
    of the user's own, those given (its defaults are its own code's)."""
    spec = get(algorithm) if isinstance(algorithm, str) else algorithm if isinstance(algorithm, MethodSpec) else None
    if spec is not None:
        return spec.resolved(**dict(hparams or {}))
    return {k: _jsonable(v) for k, v in (hparams or {}).items()}


def run_config(settings: Settings, algorithm: str, hparams, likelihood, model, flat: FlatModel, sizes) -> dict:
    """The run's identity (`algorithm`: its name; `hparams`: `recorded_hparams`), written to config.json, recorded in
    the checkpoint and compared on resume."""
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
        "hparams": dict(hparams),
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
