"""`bayesadmm.run`: a federated experiment from your own model, data, likelihood and algorithm.

    import bayesadmm
    result = bayesadmm.run(model, clients=[(X1, y1), (X2, y2)], test=(X_test, y_test),
                           algorithm="ivon-admm", hparams={"lr": 0.1, "epochs": 2}, rounds=20, out="runs/mine")
    result.history[-1]["ens_test_acc"], result.posterior.mean

It assembles a `Federation` (engine/loop.py) from ordinary objects and runs the engine's loop, with every feature of
`bayesadmm run PRESET`: partial participation, generators per (seed, round, client), evaluation at the server mean and
for the posterior predictive, user metrics, the run directory with config, metrics and plots, checkpoints and exact
resume, worker processes with the numbers of one, the divergence stop, a progress bar and a device.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from bayesadmm.algorithms import Algorithm
from bayesadmm.algorithms.spec import Context, MethodSpec, get
from bayesadmm.clients import ClientData, ClientObjects, TensorClients, client_ids
from bayesadmm.engine.federation import Federation, Result
from bayesadmm.engine.loop import run_federation
from bayesadmm.engine.personal import PERSONAL_SPLIT, FineTune, Personalisation, split_personal
from bayesadmm.engine.settings import Settings, dtype_name
from bayesadmm.engine.simulate import generator_for
from bayesadmm.evaluation.metrics import check_ood
from bayesadmm.experiments.values import unknown
from bayesadmm.likelihoods import Classification, Likelihood
from bayesadmm.models import FlatModel
from bayesadmm.privacy import DPSettings, noised, private_factory
from bayesadmm.runspec import OWN, Personal, RunSpec, qualified_name
from bayesadmm.userdata import as_tensors, check_client_objects, check_data, check_inputs

__all__ = ["run", "assemble", "Assembled", "algorithm_factory", "ENGINE_SUPPLIED"]

# What the engine passes to an algorithm factory that asks for it by name (its keyword arguments).
ENGINE_SUPPLIED = ("dim", "model", "num_clients", "client_sizes", "likelihood")


def algorithm_factory(
    algorithm: str | MethodSpec | Algorithm | Callable[..., Algorithm],
    hparams: Mapping[str, Any],
    model: FlatModel,
    client_sizes: Mapping[int, int],
    likelihood: Likelihood | None = None,
    rounds: int | None = None,
    participation: float = 1.0,
    compile: str = "auto",
) -> Callable[[], Algorithm]:
    """A zero-argument callable that builds the algorithm, picklable when `algorithm` is (worker processes get it).

    `algorithm`: a registered method's name (`bayesadmm.algorithms.names()`) or its `MethodSpec`: `hparams` are its
    hyperparameters (checked now: unknown, missing or invalid ones raise ValueError), built with a `Context` of the
    model, the client sizes, `likelihood`, `rounds` (the run's length, for schedules such as IVON's `cosine`),
    `participation` and `compile` (the run's setting, which the method's solver turns into its kernels' choice);
    a factory (any callable returning an Algorithm:
    it gets `hparams` as keyword arguments plus whichever of `dim`, `model`, `num_clients`, `client_sizes` and
    `likelihood` its signature names; `likelihood` only where one is given here, so that a method that needs its
    curvature can check it), or a ready Algorithm (then `hparams` must be empty; it runs in this process only, as a
    tuple of closures does not pickle).
    """
    if isinstance(algorithm, str):
        algorithm = get(algorithm)
    if isinstance(algorithm, MethodSpec):
        context = Context(model.dim, model, dict(client_sizes), likelihood, rounds, participation, compile)
        return algorithm.factory(algorithm.make_hparams(**hparams), context)
    if isinstance(algorithm, Algorithm):
        if hparams:
            raise ValueError(f"hparams {sorted(hparams)} given with a ready Algorithm; pass its factory instead")
        return functools.partial(_ready, algorithm)
    if not callable(algorithm):
        raise TypeError(f"algorithm must be a registry name, a factory or an Algorithm, got {type(algorithm).__name__}")
    parameters = inspect.signature(algorithm).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    supplied = {"dim": model.dim, "model": model, "num_clients": len(client_sizes), "client_sizes": dict(client_sizes)}
    if likelihood is not None:
        supplied["likelihood"] = likelihood
    kwargs = {k: v for k, v in supplied.items() if k in parameters and k not in hparams}
    extra = sorted(k for k in hparams if k not in parameters and not takes_any)
    if extra:
        valid = sorted(k for k, p in parameters.items() if k not in ENGINE_SUPPLIED and p.kind is not p.VAR_KEYWORD)
        raise ValueError(unknown(f"{qualified_name(algorithm)} has no hyperparameters", extra, valid))
    return functools.partial(algorithm, **kwargs, **hparams)


class Assembled(NamedTuple):
    """A run's algorithm factory (zero arguments, picklable where the method is) and its differential privacy with
    the noise multiplier it uses (None: not private), which a run directory records."""

    make: Callable[[], Algorithm]
    dp: DPSettings | None


def assemble(
    spec: RunSpec,
    model: FlatModel,
    client_sizes: Mapping[int, int],
    likelihood: Likelihood | None = None,
    *,
    factory: MethodSpec | Algorithm | Callable[..., Algorithm] | None = None,
    given: Mapping[str, Any] | None = None,
) -> Assembled:
    """The algorithm of the run `spec` records: `algorithm_factory`'s (its method built with its hyperparameters and
    the run's context: `model`, `client_sizes`, the likelihood, the settings' rounds, participation and compile),
    made private as `spec.dp` says (`privacy.private_factory`, its noise calibrated to `dp.epsilon` where it gives
    none: `privacy.noised`). The one place where `bayesadmm.run`, the command line, the Flower strategy and apps and
    `bayesadmm.load` build a run's algorithm; a ValueError naming the fix where the method refuses its settings, the
    likelihood or the privacy asked (only a registered method declares the update client-level DP noises).

    `likelihood`: the object (default: the record's, `spec.likelihood.build()`; one of the user's own must be
    given). `factory`: what builds a method the record only names (``own:...``: the user's factory, Algorithm or
    unregistered MethodSpec); a registered method is found by its name."""
    if likelihood is None:
        likelihood = spec.likelihood.build()
    if factory is None and spec.own:
        raise ValueError(f"the run's method is your own {spec.method[len(OWN) :]}: pass its factory (factory=...)")
    algorithm = factory if factory is not None else get(spec.method)
    settings = spec.settings
    hparams = spec.hparams if given is None else given
    make = algorithm_factory(
        algorithm, hparams, model, client_sizes, likelihood, settings.rounds, settings.participation, settings.compile
    )
    if spec.dp is None:
        return Assembled(make, None)
    method = algorithm if isinstance(algorithm, MethodSpec) else None
    record = method.make_hparams(**spec.hparams) if method is not None else None
    participation, rounds = settings.participation, settings.rounds
    chosen = noised(make, method, record, spec.dp, participation=participation, sizes=client_sizes, rounds=rounds)
    private = private_factory(
        make, method, record, chosen, participation=participation, sizes=client_sizes, rounds=rounds,
        seed=settings.seed,
    )  # fmt: skip
    return Assembled(private, chosen)


def _ready(algorithm: Algorithm) -> Algorithm:
    return algorithm


def _clients_and_test(
    clients: Any, test: Any, model: FlatModel, theta0: Tensor, likelihood: Likelihood, device: str
) -> tuple[TensorClients | ClientObjects, Tensor, Tensor]:
    """The client source (a `TensorClients` from (X, y) pairs / Datasets, or a `ClientObjects` from ready
    `ClientData` objects) and the test set, checked against the model and the likelihood (`userdata.check_data`):
    data that does not fit is a `DataError` naming the client, before the run directory exists."""
    by_id = dict(clients) if isinstance(clients, Mapping) else dict(enumerate(clients))
    client_ids(by_id)
    if not by_id:
        raise ValueError("clients is empty: give a list of (X, y) pairs or Datasets, or a mapping id → one")
    test_pair = as_tensors(test, "the test set")
    if all(isinstance(data, ClientData) for data in by_id.values()):
        check_client_objects(theta0.to(device), by_id)
        _, checked = check_data(model, theta0, likelihood, {}, test_pair)
        source: TensorClients | ClientObjects = ClientObjects(by_id)
    else:
        parts = {k: as_tensors(data, f"client {k}") for k, data in by_id.items()}
        parts, checked = check_data(model, theta0, likelihood, parts, test_pair)
        source = TensorClients.from_parts(model, parts, likelihood, device)
    return source, checked[0], checked[1]


def run(
    model: nn.Module | FlatModel,
    clients: Sequence[Any] | Mapping[int, Any],
    test: Any,
    *,
    algorithm: str | Algorithm | Callable[..., Algorithm] = "ivon-admm",
    hparams: Mapping[str, Any] | None = None,
    likelihood: Likelihood | None = None,
    metrics: Mapping[str, Callable[[Tensor, Tensor], float]] | None = None,
    ood: Any = None,
    rounds: int = 10,
    seed: int = 0,
    participation: float = 1.0,
    eval_samples: int = 32,
    workers: int = 1,
    device: str = "cpu",
    checkpoint_every: int = 1,
    stop_at: int = 0,
    cohort: int = 0,
    dtype: str | None = None,
    compile: str = "auto",
    client_store: str = "auto",
    out: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    on_round: Callable[[dict], None] | None = None,
    personal_split: float = 0.0,
    personal_every: int = 0,
    finetune_epochs: int = 3,
    dp: DPSettings | None = None,
) -> Result:
    """Run a federated experiment and return its `Result`: the status, the metrics of every round, the final server
    state and `result.posterior`, and the run directory. (Its length is this Args list; the body is about 35 lines.)

    Args:
        model: any `torch.nn.Module` (its current parameters are the initial ones; its buffers are carried as
            constants) or a `FlatModel`.
        clients: a list of clients, or a mapping from client id (int) to client, each an (X, y) pair of tensors or
            array-likes (numpy arrays, lists of numbers), a `torch.utils.data.Dataset` of (x, y) pairs, or a ready
            `bayesadmm.ClientData` object. Checked against the model and the likelihood before anything is written
            (`bayesadmm.userdata.check_data`; the rules: docs/guides/own-model.md): integer labels of any dtype
            become int64, integer features the model's float dtype unless it takes them as they are; data that does
            not fit raises `DataError` naming the client and the fix.
        test: the evaluation set, an (X, y) pair or a Dataset, checked as the clients are.
        algorithm: a registered method's name (`bayesadmm.algorithms.names()`, including a user's own registered
            with `bayesadmm.algorithms.register`), a factory, or an Algorithm (see `algorithm_factory`). A factory
            must be a module-level function (or a partial of one) for workers > 1.
        hparams: the algorithm's hyperparameters, a mapping of name → value (for a registered method, the fields
            of its spec's `hparams` dataclass; `cosine=True` schedules over `rounds`).
        likelihood: `Classification()` (default), `GaussianRegression(noise)`, `Poisson()` or
            `NegLogLikelihood(fn)`. It reaches the algorithm's factory too (where its signature names `likelihood`):
            the methods that need its curvature (fedlap-cov, fedlap-func, fedep/fedsep/fedpa with
            inference="laplace" or "ngvi") refuse one without it here, with a `MissingCurvatureError`.
        metrics: extra metrics, name → `fn(outputs (S, N, ...), targets) -> float`, reported as `test_<name>` at
            the mean and `ens_test_<name>` for the predictive.
        ood: out-of-distribution inputs (a tensor or array, no targets; classification only), checked as the test
            inputs are. Each evaluation then also reports how well the predictive entropy and the max probability
            tell them from the test inputs (`test_ood_auroc_entropy`, `test_ood_auroc_maxprob`) and the selective
            accuracies `test_sel_acc50/80/90` (`bayesadmm.uncertainty`), each with its `ens_` version.
        rounds: communication rounds.
        seed: the seed every generator of (seed, round, client) derives from.
        participation: the fraction of clients drawn each round.
        eval_samples: posterior samples for the predictive's metrics.
        workers: client updates in that many processes (0: one per core), with the numbers of one.
        device: the torch device the clients train on and the evaluation runs on.
        checkpoint_every: write the checkpoint every N rounds (and after the last).
        stop_at: stop after this round, keeping the schedule of `rounds` (0: run all rounds).
        cohort: train a round's clients that many at a time as one batched computation where the method's local
            solver allows it (Adam and IVON), in this process or in each worker; the per-client numbers up to
            rounding. 0: automatic (on a CPU the clients spread over the cores, at most 16 a cohort for Adam and
            one client at a time for IVON, where batching is no faster; each worker's clients, at most 64, on a
            GPU); 1: one client at a time.
        dtype: "float32" or "float64", the precision the run computes in; by default the model's (a float64
            module runs in float64). One that differs from the model's parameters is an error: cast the model.
        compile: "auto", "on" or "off": whether IVON's solver calls its torch.compile'd kernels (seconds to
            compile once per process, then faster steps) or the same maths eagerly; the numbers agree to rounding,
            not bit for bit. "auto" compiles where the run's local steps win back the compilation, a rule of the
            run's settings and model only (`bayesadmm.optim.compilation`), recorded in environment.json.
        client_store: where the client states live: "memory", "disk" (block files in the run directory, at most
            a bounded cache of them in memory) or "auto" (on disk above 2000 clients); the same numbers either way.
        out: the run directory (default: a new `runs/run-<date-time>`).
        resume: continue the checkpoint in `out`, called with the same arguments; the numbers are those an
            uninterrupted run would have.
        overwrite: replace a run already in `out`; without it a run directory that holds a run raises
            `RunDirError`, as does a second process writing the same directory.
        progress: show the progress: a bar on a terminal, one line per round (at most 50 a run) and one at the end
            where stderr is not a terminal (a file, a pipe, CI).
        on_round: called with each round's metrics line (a dict).
        personal_split: hold out this fraction of every client's data as its own test split (seeded, stream
            `engine.personal.PERSONAL_SPLIT`; 0: none, the run as without it) and evaluate on it, after the last
            round and every `personal_every` rounds, the global and each client's personal model (personal.jsonl,
            and `personal_*`/`global_*` means and worst clients in the metrics); `finetune_epochs`: the local Adam
            epochs of the personal model of methods that keep no client posterior (docs/guides/posterior.md).
        dp: differential privacy (`bayesadmm.DPSettings`; docs/guides/privacy.md): client-level DP of the server's
            sum for the methods that declare their update (fedavg, fedprox, ivon-admm, ivon-pvi), ε spent per round
            as `dp_epsilon` in the metrics, and a stop with status "budget" before the round that would exceed
            `dp.epsilon`. None: none, the run as without it.
    """
    checked_dp(dp)
    settings = Settings(
        rounds=rounds,
        seed=seed,
        participation=participation,
        eval_samples=eval_samples,
        device=device,
        workers=workers,
        checkpoint_every=checkpoint_every,
        stop_at=stop_at,
        cohort=cohort,
        dtype=dtype or "float32",
        compile=compile,
        client_store=client_store,
    )
    likelihood = _checked_arguments(hparams, likelihood)
    flat, theta0 = flat_model(model)
    settings = _in_model_dtype(settings, dtype, theta0)
    finetune = FineTune(finetune_epochs)
    source, X_test, y_test = _clients_and_test(clients, test, flat, theta0, likelihood, device)
    source, tests = _personal_split(source, personal_split, seed, device)
    X_ood = _ood_inputs(ood, likelihood, flat, theta0, X_test)
    spec = RunSpec.of(
        algorithm, hparams, likelihood=likelihood, settings=settings, dp=dp,
        personal=Personal(personal_split, personal_every, finetune_epochs) if tests is not None else None,
    )  # fmt: skip
    factory = None if isinstance(algorithm, str) or not spec.own else algorithm
    make, dp = assemble(
        spec, flat, source.sizes, likelihood, factory=factory, given=None if factory is None else hparams
    )
    make()  # built once now, so that a method refuses its settings or this likelihood before the run directory exists
    personal = Personalisation(tests, personal_every, finetune) if tests is not None else None
    federation = Federation(
        flat, source, make, theta0, X_test.to(device), y_test.to(device), likelihood, dict(metrics or {}),
        personal=personal, ood_X=None if X_ood is None else X_ood.to(device),
    )  # fmt: skip
    run_dir = Path(out) if out is not None else Path("runs") / datetime.now().strftime("run-%Y%m%d-%H%M%S-%f")
    name = algorithm if isinstance(algorithm, str) else qualified_name(algorithm)
    config = _config_record(settings, name, spec.hparams, likelihood, model, flat, source.sizes)
    if personal is not None:  # only then: the files of other runs stay as they were
        config["personal"] = {"split": personal_split, "every": personal_every, "finetune_epochs": finetune_epochs}
    if X_ood is not None:  # likewise
        config["ood"] = {"inputs": list(X_ood.shape)}
    if dp is not None:  # likewise; with the noise the run uses, so that `bayesadmm.load` need not calibrate it again
        config["dp"] = dp.to_json()
    config["run"] = dataclasses.replace(spec, dp=dp).to_json()  # the record every door writes alike
    result = run_federation(
        federation,
        settings,
        run_dir,
        config=config,
        resume=resume,
        progress=progress,
        title=algorithm if isinstance(algorithm, str) else "",
        on_round=on_round,
        overwrite=overwrite,
    )
    if result.status == "diverged":  # said where the user looks, not only in result.status and status.json
        print(
            f"bayesadmm: diverged in {result.message} (the state of round {result.round} is in {run_dir})",
            file=sys.stderr,
        )
    return result


def _config_record(settings: Settings, algorithm: str, hparams, likelihood, model, flat: FlatModel, sizes) -> dict:
    """config.json's tables of a `bayesadmm.run` run beside its record: the method's name (a factory's qualified
    name), its hyperparameters as recorded (`RunSpec.hparams`: a registered method's whole), the settings, the
    likelihood's and the model's reprs, the number of parameters and the clients' sizes, which `bayesadmm.load`
    checks the caller's model and likelihood against; with the record, the checkpoint's identity a resume meets."""
    shown = ("rounds", "seed", "participation", "eval_samples", "device", "workers", "checkpoint_every", "stop_at",
             "cohort", "compile")  # fmt: skip
    return {
        "settings": {k: getattr(settings, k) for k in shown},
        "algorithm": algorithm,
        "hparams": dict(hparams),
        "likelihood": repr(likelihood),
        "model": repr(model) if isinstance(model, nn.Module) else repr(flat),
        "parameters": flat.dim,
        "clients": {str(k): n for k, n in sizes.items()},
    }


def checked_dp(dp: Any) -> DPSettings | None:
    """`dp` if it is a `DPSettings` or None; anything else (a level's name, a mapping, ε alone) refused by type,
    where it would otherwise fail later on a missing attribute."""
    if dp is not None and not isinstance(dp, DPSettings):
        shown = repr(dp) if len(repr(dp)) <= 80 else repr(dp)[:77] + "..."
        raise TypeError(f"dp= takes a bayesadmm.DPSettings(level=..., ...), got {type(dp).__name__} {shown}")
    return dp


def _personal_split(source, fraction: float, seed: int, device: str) -> tuple[Any, dict | None]:
    """The clients without their personal test rows and those rows by client (on `device`), drawn from the stream
    (seed, 0, PERSONAL_SPLIT); for fraction 0 the source as it is and None (`split_personal` checks the others)."""
    if isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and fraction == 0:
        return source, None
    if not isinstance(source, TensorClients):
        raise ValueError(
            "personal_split needs the clients' examples: give them as (X, y) pairs or Datasets, not ClientData objects"
        )
    rows = {k: torch.arange(a, b) for k, (a, b) in source.slices.items()}
    train, test = split_personal(rows, fraction, generator_for(seed, 0, PERSONAL_SPLIT))
    parts = {k: (source.X[train[k]], source.y[train[k]]) for k in train}
    tests = {k: (source.X[test[k]].to(device), source.y[test[k]].to(device)) for k in test}
    return TensorClients.from_parts(source.model, parts, source.likelihood, device), tests


def _checked_arguments(hparams, likelihood: Likelihood | None) -> Likelihood:
    """`run`'s checks of `hparams` (a mapping or None) and `likelihood`; returns the likelihood (default
    `Classification()`)."""
    if hparams is not None and not isinstance(hparams, Mapping):
        raise TypeError(
            f"hparams must be a mapping of name → value, e.g. {{'lr': 0.1}}, got {type(hparams).__name__}; "
            "for (name, value) pairs pass dict(pairs)"
        )
    likelihood = likelihood or Classification()
    if not isinstance(likelihood, Likelihood):
        raise TypeError(
            f"likelihood must implement bayesadmm.Likelihood (mean_nll, predictive, metrics), "
            f"got {type(likelihood).__name__}"
        )
    return likelihood


def _ood_inputs(ood: Any, likelihood: Likelihood, model: FlatModel, theta0: Tensor, X_test: Tensor) -> Tensor | None:
    """The OOD inputs checked against the likelihood (a classifier's) and as the test inputs are; None if not given."""
    if ood is None:
        return None
    X_ood = check_inputs(model, theta0, ood, X_test)
    check_ood(likelihood, X_ood, X_test)
    return X_ood


def flat_model(model) -> tuple[FlatModel, Tensor]:
    """`model` as a FlatModel and the starting parameters: a FlatModel's `initial_params` (from a fresh default
    generator), or an nn.Module's current parameters, flattened."""
    flat = model if isinstance(model, FlatModel) else FlatModel.from_module(model)
    theta0 = (
        flat.initial_params(torch.Generator())
        if isinstance(model, FlatModel)
        else flat.flatten(dict(model.named_parameters())).detach().clone()
    )
    return flat, theta0


def _in_model_dtype(settings: Settings, dtype: str | None, theta0: Tensor) -> Settings:
    """The settings with the model's dtype (that of its parameters `theta0`); a ValueError naming the fix where
    `dtype` was given and differs from it."""
    model_dtype = dtype_name(theta0.dtype)
    if dtype is not None and dtype != model_dtype:
        raise ValueError(
            f"dtype={dtype!r} but the model's parameters are {model_dtype}: cast the model "
            f"(model.to(torch.{dtype})), or leave dtype unset to run in the model's"
        )
    return dataclasses.replace(settings, dtype=model_dtype)
