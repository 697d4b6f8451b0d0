"""Diagnostic runs for why IVON-ADMM learns slower in its first rounds than the paper reports (docs/results).

    python scripts/probe_ivon_admm.py VARIANT SCENARIO OUT [KEY=VALUE ...]

Each variant is the scenario's IVON-ADMM run on the validation split (`validation=0.1`, `stop_at=10`, as
scripts/select_ivon_lr.sh; never the test set) with one reading of the authors' setup changed that the paper leaves
open or states differently from what we do. They probe Alg. 2 as written (h <- h0 every round), so they run with
`restart_at_q_g=false` (the presets' default became true after these probes):

  rescale-lr  the step size is lr·(h0 + δ) (the ivon-opt package's default `rescale_lr`), not Alg. 2's lr
  zero-init   the server starts at m_g = 0, as Alg. 1 writes, not at the network's random initialisation
  keep-hess   each client's IVON Hessian estimate h carries over from its previous round instead of Alg. 2's h ← h0
              (an optimizer state kept across rounds; the authors' code keeps IVON's momentum and step count, not h,
              which it resets to 0: that reading is `bayesadmm run ... restart_at_q_g=true`, a library option)
  keep-momentum  IVON's gradient momentum and its step count carry over from the client's previous round (so the
              momentum is not debiased afresh), as the authors' code does; m and h start as usual. Probed with the presets' restart (`restart_at_q_g=true stop_at=50` as overrides) for the NLL gap at round 50
  baseline    none of these (the published settings, Alg. 2 as written)

The carry-over variants are the library's IVON solver with a round-start object of the probe's own (`CarryOver`, a
`solvers.ivon.RoundStart`); rescale-lr is its step-size schedule wrapped in `solvers.ivon.RescaledLR`.

OUT becomes a normal run directory (plus probe.json, naming the variant): `bayesadmm compare OUT --at 5,10`
tabulates it. These are probes, not library features: the run is the config's (`bayesadmm.experiments.build`) with
the federation's initial weights or algorithm factory replaced, run by the engine's loop. The replacements are
module-level, so they pickle to worker processes (`workers=N` among the overrides; one worker by default). The
carried-over IVON state lives in the solver of the process that trains the client (clients stay in their worker), not
in the checkpointed client state: `bayesadmm resume` of such a run directory would continue without the variant.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from bayesadmm.algorithms import bayes_admm, ivon_admm
from bayesadmm.algorithms.base import Algorithm
from bayesadmm.engine.loop import run_federation
from bayesadmm.experiments import build as setup
from bayesadmm.experiments.config import resolve
from bayesadmm.families import DiagonalGaussian
from bayesadmm.federated import algorithm_factory
from bayesadmm.optim import ivon
from bayesadmm.solvers.ivon import RescaledLR, RoundStart

VARIANTS = ("baseline", "rescale-lr", "zero-init", "keep-hess", "keep-momentum")


def keep_hess(init: ivon.IVONState, last: ivon.IVONState) -> ivon.IVONState:
    return init._replace(hess=last.hess.clamp(min=0))   # h clamped at 0, as init requires


def keep_momentum(init: ivon.IVONState, last: ivon.IVONState) -> ivon.IVONState:
    # the gradient momentum and the step count (so momentum is not debiased again), as the authors' code keeps them
    return init._replace(momentum=last.momentum, step=last.step)


KEEP = {"keep-hess": keep_hess, "keep-momentum": keep_momentum}


@dataclass(frozen=True)
class CarryOver:
    """A round start that begins each client's solve from what `keep(init_state, last_state)` takes of the state the
    client's previous solve ended with, `init_state` being what `base` starts from (a client's first solve starts
    as `base` does)."""

    base: RoundStart
    keep: Callable[[ivon.IVONState, ivon.IVONState], ivon.IVONState]
    # client → its last IVON state. Keyed by the data object's id: the engine builds each client's data once per
    # process and keeps it for the run, and the solver is not told the client id.
    last: dict = field(default_factory=dict, compare=False, repr=False)

    def initial_state(self, m_g: torch.Tensor, hess_init: float, round_: int, data) -> ivon.IVONState:
        state = self.base.initial_state(m_g, hess_init, round_, data)
        previous = self.last.get(id(data))
        return state if previous is None else self.keep(state, previous)

    def finished(self, data, state: ivon.IVONState) -> None:
        self.base.finished(data, state)
        # the solve is over, so its state (updated in place during the solve) is no longer written to
        self.last[id(data)] = state


def make_variant(variant: str, dim: int, rho: float, gamma: float, delta: float, lr: float, tau: float = 1.0,
                 epochs: int = 1, batch_size: int = 32, hess_init: float = 1e-3, beta1: float = 0.9,
                 beta2: float = 0.99999, mc_samples: int = 1, clip_radius: float = math.inf,
                 cosine_rounds: int | None = None, restart_at_q_g: bool = False, server_rho: float | None = None,
                 name: str = "ivon-admm") -> Algorithm:
    """`bayesadmm.algorithms.ivon_admm.make` (same hyperparameters) with the variant's IVON solver."""
    solver = ivon_admm.make_solver(lr=lr, tau=tau, epochs=epochs, batch_size=batch_size, hess_init=hess_init,
                                   beta1=beta1, beta2=beta2, mc_samples=mc_samples, clip_radius=clip_radius,
                                   cosine_rounds=cosine_rounds, restart_at_q_g=restart_at_q_g)
    if variant == "rescale-lr":
        solver = dataclasses.replace(solver, schedule=RescaledLR(solver.schedule))
    elif variant in KEEP:
        solver = dataclasses.replace(solver, start=CarryOver(solver.start, KEEP[variant]))
    else:
        raise ValueError(f"no solver variant {variant!r}")
    return bayes_admm.make(DiagonalGaussian(dim), solver, rho=rho, delta=delta, gamma=gamma, server_rho=server_rho,
                           name=name)


def variant_federation(variant: str, built: setup.Built, config):
    """The configured federation with the variant's change."""
    federation = built.federation
    if variant == "baseline":
        return federation
    if variant == "zero-init":
        return dataclasses.replace(federation, theta0=torch.zeros_like(federation.theta0))
    # the configured hyperparameters as `bayesadmm run` passes them to ivon_admm.make (cosine=true: cosine_rounds);
    # the variants are of the server that sums every client's last reply (incremental=false, proximal=all)
    if config.hparams.get("incremental") or config.hparams.get("proximal", "all") != "all":
        raise SystemExit("probe_ivon_admm.py: its variants take incremental=false and proximal=all")
    hparams = {k: v for k, v in config.hparams.items() if k not in ("cosine", "incremental", "proximal")}
    if config.hparams.get("cosine"):
        hparams["cosine_rounds"] = config.rounds
    make = algorithm_factory(functools.partial(make_variant, variant), hparams, federation.model,
                             federation.clients.sizes)
    return dataclasses.replace(federation, make_algorithm=make)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] not in VARIANTS:
        print(__doc__)
        return 2
    variant, scenario, out, *overrides = argv
    config, _ = resolve(scenario, ["method=ivon-admm", "validation=0.1", "stop_at=10", "restart_at_q_g=false",
                                   "workers=1", *overrides, f"out={out}"])
    built = setup.build(config)
    run_dir = config.run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    setup._write_split(config, built)   # partition.json and labels.png, as `bayesadmm run` writes them
    result = run_federation(variant_federation(variant, built, config), built.settings, run_dir,
                            config=config.to_json(), progress=False,
                            title=f"{config.scenario} — {config.method} {variant} (seed {config.seed})")
    # config.json cannot say what the probe changed: record it beside
    (run_dir / "probe.json").write_text(json.dumps({"variant": variant, "command": argv}) + "\n")
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
