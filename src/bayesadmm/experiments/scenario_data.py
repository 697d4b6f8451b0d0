"""The built-in scenarios as data: one JSON file per scenario, bayesadmm/experiments/scenarios/SCENARIO.json, read
and checked here. A file holds

    note       where the scenario's settings come from
    settings   its general keys (data, split, model, rounds, ...: `RunConfig`'s fields)
    methods    method -> {"preset": {hyperparameter: value}, "source": where the values come from}: the built-in
               methods' settings in the scenario (a preset fills what the command line leaves out)
    reference  row -> {"acc": {round: %}, "nll": {round: value}, "source": ...}: the papers' published numbers
               (`bayesadmm compare --paper`), rows named METHOD (at the mean) or METHOD+predictive; optional

Every method a file names must be registered (importing `bayesadmm.algorithms` registers the built-in ones), and its
preset must build its spec's hyperparameter record (`MethodSpec.make_hparams`); a failure names the file, the
scenario, the method and the valid keys. A method of the user's own, which these files do not name, declares its
presets and published numbers in its spec (`MethodSpec.presets`, `.reference`); `presets_of` and `references` read
both places, so every reader (the configuration, `bayesadmm methods show`, `compare --paper`) sees one table.
"""

from __future__ import annotations

import copy
import functools
import json
import typing
from importlib import resources

from bayesadmm.algorithms import spec as method_specs
from bayesadmm.experiments.values import ConfigError

__all__ = ["scenarios", "presets_of", "presets_by_method", "references", "check"]

FOLDER = "scenarios"  # under bayesadmm/experiments
KEYS = {"note", "settings", "methods", "reference"}
METRICS = ("acc", "nll")


def _where(scenario: str) -> str:
    return f"bayesadmm/experiments/{FOLDER}/{scenario}.json"


@functools.cache  # the package's own files, which do not change while it runs; readers get copies (`_files`)
def _read() -> dict[str, dict]:
    """Every scenario file, parsed and its layout checked, by scenario name (the file's name), sorted."""
    folder = resources.files("bayesadmm.experiments").joinpath(FOLDER)
    table = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            scenario = entry.name.removesuffix(".json")
            table[scenario] = _layout(scenario, json.loads(entry.read_text()))
    return table


def _layout(scenario: str, data: typing.Any) -> dict:
    """`data` if it has the layout of the module docstring; a ConfigError naming the file and the key otherwise."""
    where = _where(scenario)
    if not isinstance(data, dict) or not {"settings", "methods"} <= set(data) or set(data) - KEYS:
        raise ConfigError(f"{where}: a scenario file is an object of {', '.join(sorted(KEYS))} (settings and methods "
                          "required)")  # fmt: skip
    for method, entry in data["methods"].items():
        if not (
            isinstance(entry, dict) and isinstance(entry.get("preset"), dict) and set(entry) <= {"preset", "source"}
        ):
            raise ConfigError(f'{where}: methods.{method} must be {{"preset": {{...}}, "source": "..."}}')
    for row, numbers in data.get("reference", {}).items():
        tables = {k: v for k, v in numbers.items() if k != "source"} if isinstance(numbers, dict) else None
        if not tables or set(tables) - set(METRICS) or not all(isinstance(v, dict) for v in tables.values()):
            raise ConfigError(f"{where}: reference.{row} must hold acc and/or nll, each {{round: value}}, and a source")
    return data


def _files() -> dict[str, dict]:
    """A copy of the parsed files, which the caller may change."""
    return copy.deepcopy(_read())


def _registered(method: str, scenario: str, what: str) -> method_specs.MethodSpec:
    try:
        return method_specs.get(method)
    except ValueError:
        raise ConfigError(
            f"{_where(scenario)}: {what} names method {method!r}, which is not registered; registered: "
            f"{', '.join(method_specs.names())}"
        ) from None


def _checked(spec: method_specs.MethodSpec, scenario: str, preset: dict) -> dict:
    """`preset` if it builds the hyperparameter record of `spec`; a ConfigError naming the file, the scenario, the
    method and the valid keys otherwise."""
    valid = [f.name for f in spec.fields()]
    unknown = sorted(set(preset) - set(valid))
    if unknown:
        raise ConfigError(
            f"{_where(scenario)}: scenario {scenario}, method {spec.name}: unknown hyperparameters "
            f"{', '.join(unknown)}; valid: {', '.join(valid)}"
        )
    try:
        spec.make_hparams(**preset)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{_where(scenario)}: scenario {scenario}, method {spec.name}: {exc}") from None
    return preset


def scenarios() -> dict[str, dict]:
    """The built-in scenarios' settings (data, split, model and schedule), by name, sorted."""
    return {scenario: data["settings"] for scenario, data in _files().items()}


def presets_of(spec: method_specs.MethodSpec) -> dict[str, dict]:
    """scenario -> the settings of the method `spec` in that built-in scenario: the scenario files' (checked against
    its hyperparameters) and those its spec declares itself (a user's method). A scenario given both places is an
    error: one source for each preset."""
    table = {
        scenario: _checked(spec, scenario, data["methods"][spec.name]["preset"])
        for scenario, data in _files().items()
        if spec.name in data["methods"]
    }
    both = sorted(set(table) & set(spec.presets))
    if both:
        raise ConfigError(
            f"{spec.name}: its spec and the scenario files both give its preset for {', '.join(both)}; "
            "keep one (a built-in method's presets are in the scenario files)"
        )
    return dict(sorted({**table, **{k: dict(v) for k, v in spec.presets.items()}}.items()))


def presets_by_method() -> dict[str, dict[str, dict]]:
    """method -> `presets_of` its spec, for every registered method with presets, by name; `check` first, so a
    scenario file that names an unregistered method is an error here too."""
    check()
    return {spec.name: table for spec in method_specs.specs() if (table := presets_of(spec))}


def references() -> dict[str, dict[str, dict]]:
    """scenario -> row -> {"acc": {round: %}, "nll": {round: value}}: the papers' published numbers, from the
    scenario files and every registered spec's own `reference` (rows METHOD or METHOD+predictive)."""
    table: dict[str, dict[str, dict]] = {}
    for scenario, data in _files().items():
        for row, numbers in data.get("reference", {}).items():
            _registered(row.removesuffix("+predictive"), scenario, f"reference row {row!r}")
            table.setdefault(scenario, {})[row] = {k: v for k, v in numbers.items() if k in METRICS}
    for spec in method_specs.specs():
        for scenario, rows in spec.reference.items():
            table.setdefault(scenario, {}).update({row: _plain(numbers) for row, numbers in rows.items()})
    return table


def check() -> None:
    """Every method the scenario files name is registered and its presets build its hyperparameter record, and every
    reference row names a registered method; a ConfigError saying which file and entry otherwise."""
    for scenario, data in _files().items():
        for method, entry in data["methods"].items():
            _checked(_registered(method, scenario, "methods"), scenario, entry["preset"])
        for row in data.get("reference", {}):
            _registered(row.removesuffix("+predictive"), scenario, f"reference row {row!r}")


def _plain(value: typing.Any) -> typing.Any:
    """Plain dicts of a spec's read-only mappings."""
    return {k: _plain(v) for k, v in value.items()} if hasattr(value, "items") else value
