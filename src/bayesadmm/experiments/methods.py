"""The configuration's methods: a registered method's spec (`method_spec`), its settable hyperparameters
(`method_parameters`), its settings for a built-in scenario (`preset_for`, from `scenario_data.presets_of`) and all
of that in words (`describe`, which `bayesadmm methods show NAME` prints)."""

from __future__ import annotations

import dataclasses
import inspect
import typing

from bayesadmm.algorithms import spec as method_specs
from bayesadmm.experiments.scenario_data import presets_of
from bayesadmm.experiments.values import ConfigError

__all__ = ["method_spec", "method_parameters", "preset_for", "describe"]


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
    presets = presets_of(spec)
    if scenario in presets or not presets:
        return dict(presets.get(scenario, {}))
    keys = sorted({key for values in presets.values() for key in values})
    missing = [key for key in keys if key not in given]
    if missing:
        raise ConfigError(
            f"{spec.name} has no preset for scenario {scenario} "
            f"(it has presets for {', '.join(sorted(presets))}); set its hyperparameters explicitly: "
            + " ".join(f"{k}=VALUE" for k in missing)
        )
    return {}


def _space_words(key: str, space: typing.Mapping[str, typing.Any]) -> str:
    """A declared search-space entry in words: a range about the run's value (with what a run without a positive one
    searches), a log or uniform range, or the choices."""

    def absolute(kind: str, bounds: typing.Any) -> str:
        if kind == "choices":
            return "one of " + ", ".join(map(str, bounds))
        return f"{'log-uniform' if kind == 'log' else 'uniform'} {bounds[0]:g} to {bounds[1]:g}"

    others = [absolute(kind, bounds) for kind, bounds in space.items() if kind != "around"]
    if "around" not in space:
        return others[0]
    low, high = space["around"]
    text = f"log-uniform {low:g}x to {high:g}x the scenario's value (its preset's, or {key}=VALUE given to tune)"
    return text + (f"; without a positive one: {others[0]}" if others else "; without a positive one: refused")


def describe(name: str) -> str:
    """What a person choosing settings for method `name` needs, from its spec and the scenario files: its summary, its
    hyperparameters (type and default; "required" where there is none), its presets per scenario (`presets_of`),
    `bayesadmm tune`'s search space, and whether it has client-level DP. `bayesadmm methods show NAME` prints it."""
    spec = method_specs.get(name)
    lines = [f"{spec.name}: {spec.summary}" if spec.summary else spec.name, ""]
    lines.append(f"hyperparameters (bayesadmm run ... method={spec.name} KEY=VALUE; bayesadmm.run(hparams={{...}})):")
    rows = []
    for key, param in method_parameters(name).items():
        default = "required" if param.default is inspect.Parameter.empty else repr(param.default)
        rows.append((key, str(param.annotation), default))
    widths = [max((len(row[i]) for row in rows), default=0) for i in (0, 1)]
    lines += [f"  {key:<{widths[0]}}  {kind:<{widths[1]}}  {default}" for key, kind, default in rows]
    lines += ["", "presets (the settings of the built-in scenarios; a preset fills what the command line leaves out):"]
    presets = presets_of(spec)
    for scenario, values in presets.items():
        lines.append(f"  {scenario}: " + " ".join(f"{k}={v}" for k, v in values.items()))
    if not presets:
        lines.append("  none: give every required hyperparameter")
    lines += ["", "search space (bayesadmm tune; --space overrides it):"]
    for key, space in spec.search_space.items():
        lines.append(f"  {key}: {_space_words(key, space)}")
    if not spec.search_space:
        lines.append("  none")
    dp = "yes" if spec.dp_update is not None else "no (refused)"
    lines += ["", f"client-level differential privacy: {dp}"]
    return "\n".join(lines)
