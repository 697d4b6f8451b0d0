"""The strategies a ServerApp of your own starts: `strategy(method, model=..., **hparams)` for any registry method
(`bayesadmm.algorithms.names()`), and `strategy_from_config(context.run_config, model=...)`, which reads Flower's
run-config conventions:

    num-server-rounds   the rounds                  fraction-train     the share of clients training each round
    method              a registry name             fraction-evaluate  the share of nodes evaluating each round
    <method>.<name>     one hyperparameter of the method, typed (a TOML table ``[tool.flwr.app.config.<method>]``),
                        so ``flwr run . --run-config 'ivon-admm.lr=0.05'`` overrides one of them
    seed, out, resume, overwrite, stop-at, eval-samples, dtype, device, clients, checkpoint-every, compile
                        as in `strategy`
    likelihood          classification (default), gaussian or poisson, as `bayesadmm run` names them; a setting of
                        it as likelihood-KEY (``likelihood-noise = 0.5``)
    dp, dp-clip, dp-noise, dp-epsilon, dp-delta, dp-precision-clip   differential privacy (`bayesadmm.DPSettings`:
                        dp = "client" or "example", "" for none; dp-noise 0 with a dp-epsilon: calibrated to spend
                        it; dp-precision-clip 0 or absent: one clip)

Any other key is refused, named with where it goes (``lr`` of method fedavg: ``fedavg.lr``) or the key it is nearest
to, unless your app names it as its own (``app_keys=``: a batch size, a data path, which your app reads itself).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Collection, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from bayesadmm.algorithms.spec import get
from bayesadmm.engine.federation import Federation
from bayesadmm.engine.settings import Settings
from bayesadmm.experiments.values import suggestion
from bayesadmm.federated import assemble, checked_dp, flat_model
from bayesadmm.flower.app_config import (
    LIKELIHOOD_SETTING,
    LOCAL_ONLY,
    NodeClients,
    Timeouts,
    likelihood_spelling,
    refusal,
    run_likelihood,
)
from bayesadmm.flower.bayes_strategy import BayesStrategy
from bayesadmm.likelihoods import Classification, Likelihood
from bayesadmm.models import FlatModel
from bayesadmm.privacy import DPSettings
from bayesadmm.runspec import RunSpec
from bayesadmm.userdata import as_tensors, check_data

__all__ = ["strategy", "strategy_from_config", "CONFIG_KEYS"]

# Flower's spelling of `strategy`'s arguments in a run config
CONFIG_KEYS = {
    "num-server-rounds": "rounds", "fraction-train": "fraction_train", "fraction-evaluate": "fraction_evaluate",
    "seed": "seed", "out": "out", "resume": "resume", "overwrite": "overwrite", "stop-at": "stop_at",
    "eval-samples": "eval_samples", "dtype": "dtype", "device": "device", "clients": "clients",
    "checkpoint-every": "checkpoint_every", "compile": "compile",
}  # fmt: skip
DP_KEYS = ("dp", "dp-clip", "dp-noise", "dp-epsilon", "dp-delta", "dp-precision-clip")
# every top-level key `strategy_from_config` reads (besides likelihood-KEY and METHOD.KEY)
READ_KEYS = frozenset({*CONFIG_KEYS, *DP_KEYS, "method", "likelihood"})


def strategy(
    method: str,
    *,
    model: nn.Module | FlatModel,
    likelihood: Likelihood | None = None,
    rounds: int = 10,
    fraction_train: float = 1.0,
    fraction_evaluate: float = 1.0,
    seed: int = 0,
    out: str | Path | None = None,
    eval_data: Any = None,
    eval_samples: int = 32,
    dtype: str = "float32",
    device: str = "cpu",
    clients: int | None = None,
    resume: bool = False,
    overwrite: bool = False,
    stop_at: int = 0,
    checkpoint_every: int = 1,
    timeouts: Timeouts | None = None,
    dp: DPSettings | None = None,
    compile: str = "auto",
    **hparams: Any,
) -> BayesStrategy:
    """The Flower strategy of registry method `method` with hyperparameters `hparams` (checked now) for `model`.

    `rounds` and `fraction_train` (each round's participants, chosen with `seed` as the local engine chooses them)
    are Flower's num-server-rounds and fraction-train; `fraction_evaluate` the share of nodes that evaluate each
    round (0: none). `clients`: how many SuperNodes (clients) to wait for before round 1 (None: as many as their
    num-partitions says). `eval_data`: an (X, y) evaluation set on the server (each round's metrics line then
    scores the posterior on it; None: only the nodes evaluate). The run directory `out` (default
    runs/flower-<time>) gets what a local run writes; `resume=True` continues it. `likelihood`: Classification by
    default, GaussianRegression or Poisson; the nodes rebuild it from its name (a likelihood of your own: pass it to the
    nodes' `bayesadmm.flower.client` calls too). `dp`: differential privacy as `bayesadmm.run`'s (docs/guides/
    privacy.md): client level on the server's sum (the replies clipped and the sum noised here, ε per round in the
    metrics line, the run stopping with status "budget" before it would exceed `dp.epsilon`), or example level
    (DP-Adam or DP-IVON on the nodes, which the messages tell the noise multiplier to use). `compile`: IVON's kernels
    compiled ("on"), eager ("off") or where the run's local steps make it pay ("auto"), decided alike on every node."""
    spec = get(method)
    checked_dp(dp)
    local = sorted(set(hparams) & set(LOCAL_ONLY))  # not a hyperparameter, and not a setting of a Flower run
    if local:
        raise ValueError(f"{local[0]} is {LOCAL_ONLY[local[0]]}; leave it out of strategy()")
    fields = [f.name for f in spec.fields()]
    extra = sorted(set(hparams) - set(fields))
    if extra:  # a misspelt argument of strategy() lands among the hyperparameters: the nearest of either is named
        near = [*fields, *(name for name in inspect.signature(strategy).parameters if name != "hparams")]
        shown = ", ".join(name + suggestion(name, near) for name in extra)
        raise ValueError(f"{method} has no hyperparameters {shown}, nor is it an argument of strategy(); valid: "
                         f"{', '.join(fields)}")  # fmt: skip
    if clients is not None and (isinstance(clients, bool) or not isinstance(clients, int) or clients < 1):
        raise ValueError(f"clients must be the number of SuperNodes to wait for (>= 1) or None, got {clients!r}")
    likelihood = likelihood if likelihood is not None else Classification()
    settings = Settings(
        rounds=rounds, seed=seed, participation=fraction_train, eval_samples=eval_samples, device=device,
        workers=1, checkpoint_every=checkpoint_every, stop_at=stop_at, cohort=1, dtype=dtype, compile=compile,
    )  # fmt: skip
    flat, own_theta = flat_model(model)  # the model's own parameters: θ0 where Flower gives no initial arrays
    setup = {
        # every hyperparameter (unknown, missing or invalid ones: an error now, not on the nodes)
        "algorithm": method, "hparams": spec.resolved(**hparams), "likelihood": likelihood_spelling(likelihood),
        "seed": seed, "rounds": rounds, "device": device, "dtype": dtype, "clients": clients,
        "eval_samples": eval_samples, "participation": fraction_train, "compile": compile,
    }  # fmt: skip
    record = RunSpec.of(method, hparams, likelihood=likelihood, settings=settings, dp=dp)
    config = {
        "flower-strategy": {**setup, "clients": None, "participation": fraction_train, "model": repr(model)},
        "parameters": flat.dim,
        **({"dp": dp.to_json()} if dp is not None else {}),
        "run": record.to_json(),  # the record every door writes alike
    }
    evaluation = _evaluation(flat, own_theta, likelihood, eval_data, settings.torch_dtype)

    def federation_of(sizes: Mapping[int, int], initial: Mapping[str, Tensor] | None) -> Federation:
        theta0 = _initial(flat, own_theta, initial).to(device, settings.torch_dtype)
        make, chosen = assemble(record, flat, dict(sizes), likelihood)
        if chosen is not None:
            # config.json records the noise the run uses, so that `bayesadmm.load` need not calibrate it again (a
            # resume may change it: `engine.identity.RESUME_MAY_CHANGE`)
            config["dp"] = chosen.to_json()
            config["run"] = dataclasses.replace(record, dp=chosen).to_json()
            if chosen.level == "example":  # the nodes train privately: they are told its noise (`client_app`)
                setup["dp"] = config["dp"]
        X, y = evaluation if evaluation is not None else (None, None)
        return Federation(flat, NodeClients(dict(sizes)), make, theta0, X, y, likelihood)

    run_dir = Path(out) if out else Path("runs") / datetime.now().strftime("flower-%Y%m%d-%H%M%S")
    return BayesStrategy(
        federation_of, setup, settings, run_dir, config=config, clients=clients, fraction_evaluate=fraction_evaluate,
        timeouts=timeouts, resume=resume, overwrite=overwrite, title=f"{method} (seed {seed}, Flower)",
    )  # fmt: skip


def strategy_from_config(
    run_config: Mapping[str, Any],
    *,
    model: nn.Module | FlatModel,
    app_keys: Collection[str] = (),
    **arguments: Any,
) -> BayesStrategy:
    """`strategy` from a Flower run config (`context.run_config`; the module's doc lists its keys); `arguments`
    (model aside: likelihood, eval_data, timeouts, or any of `strategy`'s) are passed on and win over the config.
    `app_keys`: the run config's keys your app reads itself (left alone); any other key it does not read is
    refused, naming where it goes."""
    method = str(run_config.get("method") or arguments.pop("method", "ivon-admm"))
    get(method)  # an unknown method: refused, naming the registered ones
    problem = refusal(run_config, READ_KEYS, method, own=app_keys)
    if problem:
        raise ValueError(
            f"{problem}; a key your app reads itself: name it in strategy_from_config(..., app_keys=[...])"
        )
    hparams: dict[str, Any] = {
        key[len(method) + 1 :].replace("-", "_"): value
        for key, value in run_config.items()
        if key.startswith(f"{method}.") and key not in app_keys
    }
    if "likelihood" not in arguments and any(k == "likelihood" or k.startswith(LIKELIHOOD_SETTING) for k in run_config):
        arguments["likelihood"] = run_likelihood(run_config)
    found = {CONFIG_KEYS[k]: v for k, v in run_config.items() if k in CONFIG_KEYS and v != ""}
    if "clients" in found:
        clients = found.pop("clients")
        if isinstance(clients, bool) or not isinstance(clients, int) or clients < 0:
            raise ValueError(f"run config key clients: the number of SuperNodes (0: as their num-partitions says), "
                             f"got {clients!r}")  # fmt: skip
        if clients:
            found["clients"] = clients
    if run_config.get("dp"):
        clip, noise, epsilon, delta, precision_clip = (_number(run_config, key) for key in DP_KEYS[1:])
        found["dp"] = DPSettings(
            level=str(run_config["dp"]),
            clip=1.0 if clip is None else clip,
            noise_multiplier=noise or None,  # 0: calibrated to spend dp-epsilon
            epsilon=epsilon or None,
            delta=1e-5 if delta is None else delta,
            precision_clip=precision_clip or None,  # 0 or absent: one clip
        )
    try:
        return strategy(method, model=model, **{**found, **hparams, **arguments})
    except ValueError as exc:  # the settings' names as the run config spells them
        raise ValueError(_as_spelt(str(exc))) from None


def _as_spelt(text: str) -> str:
    """An error of `strategy` (or of `Settings`, which names `participation`) with each key that begins one of its
    parts (parts are joined by "; ") named as the run config spells it: ``rounds must ...`` → ``run config key
    num-server-rounds must ...``."""
    spelt = {ours: theirs for theirs, ours in CONFIG_KEYS.items()} | {"participation": "fraction-train"}
    keys = "|".join(sorted(spelt, key=len, reverse=True))
    return re.sub(rf"(?:^|(?<=; ))({keys})(?= must|=)", lambda m: f"run config key {spelt[m[1]]}", text)


def _number(run_config: Mapping[str, Any], key: str) -> float | None:
    """run_config[key] as a float, None where it is absent or ""; a ValueError naming the key for a non-number."""
    value = run_config.get(key, "")
    if value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"run config key {key}: a number, got {value!r}")
    return float(value)


def _initial(flat: FlatModel, own_theta: Tensor, initial: Mapping[str, Tensor] | None) -> Tensor:
    """θ0: Flower's initial arrays (the model's state dict; its parameters are used), else the model's own."""
    if initial is None:
        return own_theta
    missing = [name for name, _ in flat.layout if name not in initial]
    if missing:
        raise ValueError(f"initial_arrays has no {missing[:5]}: give ArrayRecord(model.state_dict()) of the model")
    return flat.flatten({name: initial[name] for name, _ in flat.layout})


def _evaluation(flat: FlatModel, own_theta: Tensor, likelihood: Likelihood, eval_data: Any, dtype: torch.dtype):
    """The server's evaluation set, checked against the model and the likelihood; None where there is none."""
    if eval_data is None:
        return None
    theta = own_theta.to(dtype)
    _, (X, y) = check_data(flat, theta, likelihood, {}, as_tensors(eval_data, "eval_data"))
    return X, y
