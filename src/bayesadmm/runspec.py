"""A run's record, `RunSpec`: what a federated run computes, the same whichever door started it.

    spec = RunSpec.of("ivon-admm", {"lr": 0.1}, likelihood=GaussianRegression(0.5), settings=Settings(rounds=20))
    spec.hparams["ess"]            # every hyperparameter, the defaults included
    RunSpec.from_json(spec.to_json()) == spec

`bayesadmm.run`, the command line (a scenario and its overrides, also through sweeps and `tune`), the Flower strategy
and the Flower apps each build one from their own spelling of the choices, and `federated.assemble` turns it into the
algorithm (made private where it says so). A run directory's config.json holds it whole under "run", beside what the
door says about where the data and the model came from (a scenario's keys, the clients' sizes, the model's repr, a
Flower run config); `bayesadmm.load` rebuilds the run's algorithm from it. The same choices give the same record from
every door.

What it holds: the method (a registered method's name, or ``own:module.name`` for a factory of the user's own, which
the record names but cannot rebuild), its hyperparameters (for a registered method every field of its record,
resolved: `MethodSpec.resolved`), the likelihood (a built-in one by name and settings, a user's own by its class's
name: `LikelihoodSpec`), the engine's settings (`Settings`: schedule, evaluation samples, execution), differential
privacy (`DPSettings`, with the noise multiplier the run uses) and personalisation (`Personal`). Every value is checked
where the record is made, from arguments or from a file: a wrong one is a ValueError naming it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from bayesadmm.algorithms.spec import MethodSpec, get, names
from bayesadmm.engine.settings import Settings
from bayesadmm.likelihoods import LIKELIHOODS, Likelihood
from bayesadmm.privacy import DPSettings

__all__ = ["RunSpec", "LikelihoodSpec", "Personal", "OWN"]

# the prefix of a method or likelihood of the user's own in a record: named, never imported from it
OWN = "own:"


@dataclass(frozen=True)
class LikelihoodSpec:
    """A likelihood as a record names it: a built-in one's name (`likelihoods.LIKELIHOODS`: classification, gaussian,
    poisson) and its settings (its dataclass's fields, e.g. ``{"noise": 0.5}``), or ``own:module.Class`` for one of
    the user's own (which the record cannot rebuild: the caller passes it)."""

    name: str = "classification"
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not (self.name in LIKELIHOODS or self.name.startswith(OWN)):
            raise ValueError(
                f"likelihood {self.name!r} is neither a built-in one ({', '.join(LIKELIHOODS)}) nor own:NAME"
            )
        if not isinstance(self.params, Mapping) or not all(isinstance(k, str) for k in self.params):
            raise ValueError(f"likelihood {self.name}'s settings must be a table of name → value, got {self.params!r}")
        object.__setattr__(self, "params", dict(self.params))
        if not self.own:
            self.build()  # its settings known and valid

    @classmethod
    def of(cls, likelihood: Likelihood) -> LikelihoodSpec:
        """The record of a likelihood object: a built-in one's name and every setting, else its class's name."""
        for name, kind in LIKELIHOODS.items():
            if type(likelihood) is kind:
                settings = dataclasses.fields(cast(Any, likelihood))
                return cls(name, {f.name: getattr(likelihood, f.name) for f in settings})
        return cls(f"{OWN}{type(likelihood).__module__}.{type(likelihood).__qualname__}")

    @property
    def own(self) -> bool:
        return self.name.startswith(OWN)

    def build(self) -> Likelihood:
        """The likelihood object; a ValueError for one of the user's own (pass it) or settings it does not take."""
        if self.own:
            raise ValueError(f"the run's likelihood is your own {self.name[len(OWN) :]}: pass it (likelihood=...)")
        try:
            return LIKELIHOODS[self.name](**self.params)
        except TypeError as exc:  # a setting it does not have
            raise ValueError(f"likelihood {self.name}: {exc}") from None

    def to_json(self) -> dict:
        return {"name": self.name, "params": dict(self.params)}


@dataclass(frozen=True)
class Personal:
    """Personalisation: the fraction of every client's data held out as its own test split, how often (in rounds;
    0: after the last only) the personal models are scored, and the local Adam epochs of the personal model of
    methods that keep no client posterior (`engine.personal`)."""

    split: float
    every: int = 0
    finetune_epochs: int = 3

    def __post_init__(self) -> None:
        if isinstance(self.split, bool) or not isinstance(self.split, (int, float)) or not 0 < self.split < 1:
            raise ValueError(f"personal split must be in (0, 1), got {self.split!r}")
        for key, least in (("every", 0), ("finetune_epochs", 1)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"personal {key} must be an integer >= {least}, got {value!r}")


@dataclass(frozen=True)
class RunSpec:
    """A run's record (the module's doc): `method`, `hparams`, `likelihood`, `settings`, `dp`, `personal`. Build it
    with `RunSpec.of` (which resolves a registered method's hyperparameters) or `RunSpec.from_json`; the constructor
    checks that a registered method's `hparams` are whole and valid."""

    method: str
    hparams: Mapping[str, Any]
    likelihood: LikelihoodSpec = LikelihoodSpec()
    settings: Settings = Settings()
    dp: DPSettings | None = None
    personal: Personal | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.method, str) or not self.method:
            raise ValueError(f"method must be a registered method's name or own:NAME, got {self.method!r}")
        if not isinstance(self.hparams, Mapping):
            raise ValueError(f"hparams must be a table of name → value, got {type(self.hparams).__name__}")
        object.__setattr__(self, "hparams", dict(self.hparams))
        for key, kind in (("likelihood", LikelihoodSpec), ("settings", Settings)):
            if not isinstance(getattr(self, key), kind):
                raise ValueError(f"{key} must be a {kind.__name__}, got {type(getattr(self, key)).__name__}")
        if self.dp is not None and not isinstance(self.dp, DPSettings):
            raise ValueError(f"dp must be a DPSettings or None, got {type(self.dp).__name__}")
        if self.personal is not None and not isinstance(self.personal, Personal):
            raise ValueError(f"personal must be a Personal or None, got {type(self.personal).__name__}")
        if self.own:
            json.dumps(self.hparams)  # a record of plain values
            return
        if self.method not in names():
            raise ValueError(
                f"method {self.method!r} is not registered here: import the module that registers it "
                "(bayesadmm.algorithms.spec.load('its_file.py'); on the command line --methods FILE)"
            )
        whole = get(self.method).resolved(**self.hparams)  # unknown, missing or invalid ones: refused, named
        if whole != self.hparams:
            left_out = sorted(set(whole) - set(self.hparams))
            raise ValueError(
                f"{self.method}'s hyperparameters are not whole (no {', '.join(left_out)}): build the record with "
                "RunSpec.of, which resolves them"
            )

    @classmethod
    def of(
        cls,
        method: str | MethodSpec | Any,
        hparams: Mapping[str, Any] | None = None,
        *,
        likelihood: Likelihood | LikelihoodSpec | None = None,
        settings: Settings | None = None,
        dp: DPSettings | None = None,
        personal: Personal | None = None,
    ) -> RunSpec:
        """The record of a run of `method` (a registered name or its `MethodSpec`: `hparams` resolved, every field
        recorded; a factory or Algorithm of the user's own: ``own:`` and its qualified name, `hparams` as given, each
        value JSON's or its repr) with the likelihood (an object or its record; default Classification()), the
        settings (default `Settings()`), `dp` and `personal`."""
        given = dict(hparams or {})
        if isinstance(method, MethodSpec) and method.name in names() and get(method.name) is method:
            method = method.name
        if isinstance(method, str):
            name, recorded = method, get(method).resolved(**given)  # an unknown name: the registry's refusal
        elif isinstance(method, MethodSpec):  # one not registered here: named, its record whole
            name, recorded = f"{OWN}{method.name}", method.resolved(**given)
        else:
            name, recorded = f"{OWN}{qualified_name(method)}", {k: _plain(v) for k, v in given.items()}
        if likelihood is None or isinstance(likelihood, LikelihoodSpec):
            record = likelihood or LikelihoodSpec()
        else:
            record = LikelihoodSpec.of(likelihood)
        return cls(name, recorded, record, settings or Settings(), dp, personal)

    @property
    def own(self) -> bool:
        """Whether the method is a factory of the user's own (named in the record, not rebuilt from it)."""
        return self.method.startswith(OWN)

    def to_json(self) -> dict:
        """The record as config.json holds it under "run" (plain JSON values)."""
        return {
            "method": self.method,
            "hparams": dict(self.hparams),
            "likelihood": self.likelihood.to_json(),
            "settings": dataclasses.asdict(self.settings),
            "dp": None if self.dp is None else self.dp.to_json(),
            "personal": None if self.personal is None else dataclasses.asdict(self.personal),
        }

    @classmethod
    def from_json(cls, record: Any) -> RunSpec:
        """The record `to_json` wrote, checked as a new one is; a ValueError naming the key of a record of another
        shape or with a wrong value."""
        if not isinstance(record, Mapping):
            raise ValueError(f"a run record is a table, got {type(record).__name__}")
        missing = [key for key in ("method", "hparams", "likelihood", "settings") if key not in record]
        extra = sorted(set(record) - {"method", "hparams", "likelihood", "settings", "dp", "personal"})
        if missing or extra:
            raise ValueError(f"a run record has no {', '.join(missing)}" if missing else f"unknown keys {extra}")
        likelihood, settings = record["likelihood"], record["settings"]
        with _named("likelihood"):
            if not isinstance(likelihood, Mapping) or set(likelihood) != {"name", "params"}:
                raise ValueError(f"a table of name and params, got {likelihood!r:.80}")
            likelihood = LikelihoodSpec(likelihood["name"], likelihood["params"])
        with _named("settings"):
            if not isinstance(settings, Mapping):
                raise ValueError(f"a table of the engine's settings, got {type(settings).__name__}")
            unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(Settings)})
            if unknown:
                raise ValueError(f"unknown settings {unknown}")
            settings = Settings(**settings)
        with _named("dp"):
            dp = None if record.get("dp") is None else DPSettings.from_json(record["dp"])
        with _named("personal"):
            found = record.get("personal")
            if found is not None and not isinstance(found, Mapping):
                raise ValueError(f"a table of split, every, finetune_epochs, got {type(found).__name__}")
            personal = None if found is None else Personal(**found)
        return cls(record["method"], record["hparams"], likelihood, settings, dp, personal)


def qualified_name(factory: Any) -> str:
    """A factory's ``module.qualname`` (through functools.partial), or its type's for an object."""
    while isinstance(factory, functools.partial):
        factory = factory.func
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', type(factory).__name__)}"


def _plain(value: Any) -> Any:
    """`value` if JSON holds it, else its repr (a user's factory may take any object)."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


@contextlib.contextmanager
def _named(key: str) -> Iterator[None]:
    """A ValueError or TypeError raised within, as a ValueError beginning with the record's `key`."""
    try:
        yield
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{key}: {exc}") from None
