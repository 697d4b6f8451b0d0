"""The configuration's methods: a registered method's spec (`method_spec`), its settable hyperparameters
(`method_parameters`) and its settings for a built-in scenario (`preset_for`)."""

from __future__ import annotations

import dataclasses
import inspect
import typing

from bayesadmm.algorithms import spec as method_specs
from bayesadmm.experiments.values import ConfigError

__all__ = ["method_spec", "method_parameters", "preset_for"]


def method_spec(method: str) -> method_specs.MethodSpec:
    """The registered spec of `method`; a `ConfigError` listing the registered methods otherwise."""
    try:
        return method_specs.get(method)
    except ValueError as exc:
        own = "a method of your own: load its module with --methods path/to/module.py, docs/guides/own-algorithm.md"
        raise ConfigError(f"{exc} ({own})") from None


def method_parameters(method: str) -> dict[str, inspect.Parameter]:
    """The user-settable hyperparameters of a registered method: the fields of its spec's `hparams` dataclass, as
    keyword parameters (the annotation a string such as "float | str", the default or `Parameter.empty`)."""
    params = {}
    for f in method_spec(method).fields():
        annotation = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", None) or str(f.type)
        default = f.default if f.default is not dataclasses.MISSING else inspect.Parameter.empty
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        params[f.name] = inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
        )
    return params


def preset_for(spec: method_specs.MethodSpec, scenario: str, given: typing.Collection[str]) -> dict:
    """The method's settings for a built-in scenario. A method with presets for other scenarios but not this one does
    not silently fall back on its defaults: every key its presets set must then be given (KEY=VALUE)."""
    if scenario in spec.presets or not spec.presets:
        return dict(spec.presets.get(scenario, {}))
    keys = sorted({key for values in spec.presets.values() for key in values})
    missing = [key for key in keys if key not in given]
    if missing:
        raise ConfigError(
            f"{spec.name} has no preset for scenario {scenario} "
            f"(it has presets for {', '.join(sorted(spec.presets))}); set its hyperparameters explicitly: "
            + " ".join(f"{k}=VALUE" for k in missing)
        )
    return {}
