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
              momentum is not debiased afresh), as the authors' code does; m and h start as usual. Probed in session
              8 with the presets' restart (`restart_at_q_g=true stop_at=50` as overrides) for the NLL gap at round 50
  baseline    none of these (the published settings, Alg. 2 as written)

OUT becomes a normal run directory (plus probe.json, naming the variant): `bayesadmm compare OUT --rounds 5,10`
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

from bayesadmm import rng
from bayesadmm.algorithms import bayes_admm
from bayesadmm.algorithms.base import Algorithm
from bayesadmm.checks import all_finite, all_positive
from bayesadmm.engine.loop import run_federation
from bayesadmm.experiments import build as setup
from bayesadmm.experiments.config import resolve
from bayesadmm.families import DiagonalGaussian
from bayesadmm.federated import algorithm_factory
from bayesadmm.optim import ivon
from bayesadmm.solvers.adam import minibatches
from bayesadmm.solvers.ivon import IVONSolver, _grad, cosine_lr
from bayesadmm.solvers.von import SolveResult, SubproblemError

VARIANTS = ("baseline", "rescale-lr", "zero-init", "keep-hess", "keep-momentum")


def keep_hess(init: ivon.IVONState, last: ivon.IVONState) -> ivon.IVONState:
    return init._replace(hess=last.hess.clamp(min=0))   # h clamped at 0, as init requires


def keep_momentum(init: ivon.IVONState, last: ivon.IVONState) -> ivon.IVONState:
    # the gradient momentum and the step count (so momentum is not debiased again), as the authors' code keeps them
    return init._replace(momentum=last.momentum, step=last.step)


KEEP = {"keep-hess": keep_hess, "keep-momentum": keep_momentum}


@dataclass(frozen=True)
class CarryOverIVON(IVONSolver):
    """IVONSolver whose solve starts each client from what `keep(init_state, last_state)` takes of the state the
    client's previous solve ended with (a client's first solve starts as usual). `solve` is IVONSolver.solve with
    the two lines marked (CARRY) added; with keep=None it gives IVONSolver's numbers bit for bit."""

    keep: Callable[[ivon.IVONState, ivon.IVONState], ivon.IVONState] | None = None
    # client → its last IVON state. Keyed by the data object's id: the engine builds each client's data once per
    # process and keeps it for the run, and solve is not told the client id.
    last: dict = field(default_factory=dict, compare=False, repr=False)

    def solve(self, family, data, lam_g, eta, rho: float, generator: torch.Generator, init=None,
              round_: int = 1) -> SolveResult:
        if not isinstance(family, DiagonalGaussian):
            raise TypeError(f"IVON learns diagonal Gaussians, not the {family.name} family")
        m_g, s_g = family.to_moments(lam_g)
        n = data.num_examples
        ess = n / (rho * self.tau)
        v = torch.mul(eta[0], self.tau).div_(n)
        u = torch.mul(eta[1], -2.0).mul_(self.tau).div_(n)
        delta = s_g / ess
        lr = cosine_lr(self.lr, round_, self.cosine_rounds)
        if self.rescale_lr:
            lr = lr * (self.hess_init + delta)

        state = ivon.init(m_g, 0.0 if self.restart_at_q_g and round_ > 1 else self.hess_init)
        if self.keep is not None and id(data) in self.last:   # (CARRY)
            state = self.keep(state, self.last[id(data)])
        ivon.check_noise_scale(state, ess, delta)
        noise_key = rng.stream_key(generator)
        steps = 0
        try:
            thetas, eps = ivon.sample(state, ess, delta, noise_key, self.mc_samples, check=False)
            terms = ivon.update_terms(m_g, lr=lr, ess=ess, delta=delta, beta1=self.beta1, beta2=self.beta2,
                                      prior_mean=m_g, v=v, u=u, clip_radius=self.clip_radius, check=False)
            batches = minibatches(n, self.batch_size, self.epochs, generator, m_g.device)
            idx = next(batches, None)
            while idx is not None:
                grads = (_grad(data, thetas[0], idx).unsqueeze(0) if self.mc_samples == 1
                         else torch.stack([_grad(data, theta, idx) for theta in thetas]))
                idx = next(batches, None)
                if idx is None:
                    state = ivon.update_with(state, grads, eps, terms, inplace=True)
                else:
                    state, thetas, eps = ivon.update_and_sample_with(state, grads, eps, noise_key, self.mc_samples,
                                                                     terms, inplace=True)
                steps += 1
        except ValueError as exc:
            raise SubproblemError(f"IVON's precision stopped being positive after {steps} steps: {exc}") from exc
        if self.keep is not None:   # (CARRY)
            self.last[id(data)] = state
        mean, precision = ivon.posterior(state, ess, delta)
        if not (all_finite(mean) and all_positive(precision)):
            raise SubproblemError("IVON diverged on this client (non-finite mean or non-positive precision); "
                                  "lower lr or the dual step")
        return SolveResult(family.from_moments(mean, precision), steps, True)


def make_variant(variant: str, dim: int, rho: float, gamma: float, delta: float, lr: float, tau: float = 1.0,
                 epochs: int = 1, batch_size: int = 32, hess_init: float = 1e-3, beta1: float = 0.9,
                 beta2: float = 0.99999, mc_samples: int = 1, clip_radius: float = math.inf,
                 cosine_rounds: int | None = None, restart_at_q_g: bool = False, server_rho: float | None = None,
                 name: str = "ivon-admm") -> Algorithm:
    """`bayesadmm.algorithms.ivon_admm.make` (same hyperparameters) with the variant's IVON solver."""
    options = dict(lr=lr, epochs=epochs, batch_size=batch_size, tau=tau, hess_init=hess_init, beta1=beta1,
                   beta2=beta2, mc_samples=mc_samples, clip_radius=clip_radius, cosine_rounds=cosine_rounds,
                   restart_at_q_g=restart_at_q_g)
    if variant == "rescale-lr":
        solver = IVONSolver(**options, rescale_lr=True)
    elif variant in KEEP:
        solver = CarryOverIVON(**options, keep=KEEP[variant])
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
    # the configured hyperparameters as `bayesadmm run` passes them to ivon_admm.make (cosine=true: cosine_rounds)
    hparams = {k: v for k, v in config.hparams.items() if k != "cosine"}
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
