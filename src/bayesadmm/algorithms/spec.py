"""What a method is, declared in one place: a `MethodSpec` per method, registered by the module that defines it.

A spec holds everything the library knows of a method beyond its equations:

    name          the name `bayesadmm run method=NAME` and `bayesadmm.run(algorithm=NAME)` use
    hparams       a frozen dataclass type: its fields (typed, with their defaults; no default: required) are the
                  method's user-settable hyperparameters, i.e. the configuration's schema, and its `__post_init__`
                  checks the values (ValueError naming the field and what is valid)
    build         build(hparams, context) -> Algorithm, with `context` what the engine supplies (`Context`)
    summary       one line for the documentation's table of methods
    presets       scenario -> {key: value}: a user's method's settings in the built-in scenarios (the built-in
                  methods' are data, in the scenario files: `experiments.scenario_data`)
    search_space  key -> {"around": [low, high]} (log-uniform from low to high times the run's value: the scenario's
                  preset, or KEY=VALUE given to the tune), optionally with one of {"log": [low, high]} |
                  {"range": [low, high]} | {"choices": [...]}, the range of a run that sets no positive value, or
                  one of these alone: `bayesadmm tune`'s (`experiments.tune`)
    reference     scenario -> row -> {"acc": {round: %}, "nll": {round: value}}: published numbers for a user's
                  method (`bayesadmm compare --paper`), rows named METHOD (at the mean) or METHOD+predictive (the
                  built-in methods' are in the scenario files)
    example       small hyperparameters for the tests' toy problems (3 classes, 4 features, a few clients)
    dp_update     dp_update(hparams) -> `privacy.ClientUpdate`: which part of a reply is the client's update, the part
                  client-level DP clips and noises (None: the method has no client-level DP, and refuses it)

`register(spec)` adds a spec (it returns it, so a module can write `SPEC = register(MethodSpec(...))`); `get(name)`,
`names()` and `specs()` read the registry. `bayesadmm methods show NAME` prints a spec with its presets from both
places (`experiments.methods.describe`). A user's method is a module that calls `register` when imported: Python
users import it, the command line loads it with `--methods path/to/module.py` (docs/guides/own-algorithm.md).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Any

from bayesadmm.algorithms.base import Algorithm
from bayesadmm.experiments.values import unknown

if TYPE_CHECKING:
    from bayesadmm.algorithms.client_update import ClientUpdate
    from bayesadmm.likelihoods import Likelihood
    from bayesadmm.models import FlatModel

__all__ = [
    "Context",
    "MethodSpec",
    "register",
    "get",
    "names",
    "specs",
    "choice",
    "load",
    "load_from_environment",
]


@dataclass(frozen=True)
class Context:
    """What the engine supplies to a method's `build`: the parameter dimension, the model, each client's number of
    examples (client id -> N_k), the clients' likelihood (None where the caller has none to give), the run's
    number of rounds (for schedules over the whole run, e.g. IVON's `cosine`; None where unknown), the fraction of
    clients per round, and the run's `compile` setting ("auto", "on", "off"), which a method with compiled kernels
    turns into its solver's choice (`optim.compilation.decide`, from its local steps over the run)."""

    dim: int
    model: FlatModel | None = None
    client_sizes: Mapping[int, int] = field(default_factory=dict)
    likelihood: Likelihood | None = None
    rounds: int | None = None
    participation: float = 1.0
    compile: str = "auto"

    @property
    def num_clients(self) -> int:
        return len(self.client_sizes)


def _frozen(value: Any) -> Any:
    """A read-only copy of nested mappings (lists become tuples), so a registered spec cannot be changed in place."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


@dataclass(frozen=True)
class MethodSpec:
    """One method: see the module docstring for the fields."""

    name: str
    hparams: type
    build: Callable[[Any, Context], Algorithm]
    summary: str = ""
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    search_space: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    reference: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    example: Mapping[str, Any] = field(default_factory=dict)
    dp_update: Callable[[Any], ClientUpdate] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a method's name must be a non-empty string, got {self.name!r}")
        if not (isinstance(self.hparams, type) and dataclasses.is_dataclass(self.hparams)):
            raise TypeError(f"{self.name}: hparams must be a dataclass type, got {self.hparams!r}")
        if not callable(self.build):
            raise TypeError(f"{self.name}: build must be callable as build(hparams, context)")
        known = {f.name for f in self.fields()}
        for table in ("presets", "search_space", "reference", "example"):
            object.__setattr__(self, table, _frozen(getattr(self, table)))
        for scenario, values in self.presets.items():
            unknown = sorted(set(values) - known)
            if unknown:
                raise ValueError(f"{self.name}: preset {scenario} sets unknown hyperparameters {', '.join(unknown)}")
        for table in ("search_space", "example"):
            unknown = sorted(set(getattr(self, table)) - known)
            if unknown:
                raise ValueError(f"{self.name}: {table} names unknown hyperparameters {', '.join(unknown)}")

    def __hash__(self) -> int:  # the tables are read-only mappings, which do not hash
        return hash((self.name, self.hparams, self.build))

    def fields(self) -> tuple[dataclasses.Field, ...]:
        """The hyperparameters: the fields of `hparams` (`init=False` fields are not settable and not listed)."""
        return tuple(f for f in dataclasses.fields(self.hparams) if f.init)

    def make_hparams(self, **values: Any) -> Any:
        """The hyperparameters record from keyword values; an unknown or missing key is a ValueError naming the
        valid ones, a bad value the record's own ValueError."""
        valid = [f.name for f in self.fields()]
        extra = sorted(set(values) - set(valid))
        if extra:
            raise ValueError(unknown(f"{self.name} has no hyperparameters", extra, valid))
        missing = [f.name for f in self.fields() if _required(f) and f.name not in values]
        if missing:
            raise ValueError(
                f"{self.name} needs {', '.join(missing)}; starting values: the presets, "
                f"`bayesadmm methods show {self.name}`"
            )
        return self.hparams(**values)

    def resolved(self, **values: Any) -> dict[str, Any]:
        """Every hyperparameter's value, the defaults included, as JSON values: what a run's configuration records,
        so that a resume or `bayesadmm.load` rebuilds the record the run had (`make_hparams(**resolved)` is the
        same record) and never takes a later version's defaults for an earlier run. Checked as `make_hparams`."""
        record = self.make_hparams(**values)
        return {f.name: _json_value(getattr(record, f.name), f"{self.name}.{f.name}") for f in self.fields()}

    def factory(self, hparams: Any, context: Context) -> Callable[[], Algorithm]:
        """A zero-argument callable building the algorithm; it pickles (for worker processes) when `build`, the
        hparams record and the context do."""
        if not isinstance(hparams, self.hparams):
            raise TypeError(f"{self.name}: hparams must be a {self.hparams.__name__}, got {type(hparams).__name__}")
        return functools.partial(self.build, hparams, context)


def _json_value(value: Any, name: str) -> Any:
    """`value` as JSON holds it: a number, string, bool or None as it is; anything else is a TypeError, since a run
    record that JSON cannot hold could not be rebuilt from config.json."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"{name} is a {type(value).__name__}; a hyperparameter's value must be a number, string or bool")


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def choice(name: str, value: Any, valid: Any, owner: str = "") -> None:
    """A ValueError naming the field `name` and its valid values unless `value` is one of `valid`."""
    if not (isinstance(value, str) and value in valid):
        prefix = f"{owner}: " if owner else ""
        raise ValueError(f"{prefix}{name} must be one of {', '.join(map(str, valid))}, got {value!r}")


_SPECS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec, *, replace: bool = False) -> MethodSpec:
    """Add `spec` to the registry and return it. Registering another spec under a taken name is an error unless
    `replace`; registering the same spec again (a module imported twice) changes nothing."""
    if not isinstance(spec, MethodSpec):
        raise TypeError(f"register takes a MethodSpec, got {type(spec).__name__}")
    other = _SPECS.get(spec.name)
    if other is not None and other != spec and not replace:
        raise ValueError(
            f"a method named {spec.name!r} is already registered (by {getattr(other.build, '__module__', '?')}); "
            "choose another name, or pass replace=True to replace it"
        )
    _SPECS[spec.name] = spec
    return spec


def get(name: str) -> MethodSpec:
    """The registered spec of `name`; a ValueError listing the registered names otherwise."""
    try:
        return _SPECS[name]
    except (KeyError, TypeError):
        raise ValueError(unknown("unknown method", [name], names(), quote=True)) from None


def names() -> list[str]:
    """The registered methods' names, sorted."""
    return sorted(_SPECS)


def specs() -> list[MethodSpec]:
    """The registered specs, sorted by name."""
    return [_SPECS[name] for name in names()]


# The method modules the command line was given (--methods), os.pathsep-separated: the CLI sets it so that the runs a
# sweep starts (new processes) load them too.
ENVIRONMENT = "BAYESADMM_METHODS"


def load(path: str | os.PathLike) -> ModuleType:
    """Import the Python file `path` (a user's method module, which registers its specs when imported) as the module
    named by its file name, and put its folder on `sys.path` so that worker processes (which import the method's
    `build` by name) find it. Only for a file the user named (`--methods`); loading the same file again does
    nothing. A file whose name is taken by another module is refused: rename it."""
    file = Path(path).expanduser().resolve()
    if file.suffix != ".py" or not file.is_file():
        raise ValueError(f"--methods {path}: not a Python file (.py)")
    name = file.stem
    if not name.isidentifier():
        raise ValueError(f"--methods {path}: {name!r} is not a module name; rename the file (letters, digits, _)")
    loaded = sys.modules.get(name)
    if loaded is not None:
        if getattr(loaded, "__file__", None) and Path(loaded.__file__).resolve() == file:  # type: ignore[arg-type]
            return loaded
        raise ValueError(f"--methods {path}: a module named {name} is already imported; rename the file")
    found = importlib.util.find_spec(name)
    if found is not None and (found.origin is None or Path(found.origin).resolve() != file):
        raise ValueError(
            f"--methods {path}: the name {name} is taken by another module ({found.origin}); rename the file"
        )
    module_spec = importlib.util.spec_from_file_location(name, file)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"--methods {path}: cannot be imported")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    if str(file.parent) not in sys.path:
        sys.path.append(str(file.parent))
    return module


def load_from_environment() -> list[ModuleType]:
    """`load` each file named in the environment variable BAYESADMM_METHODS (set by the command line's
    `--methods` for the processes it starts)."""
    return [load(path) for path in os.environ.get(ENVIRONMENT, "").split(os.pathsep) if path]
