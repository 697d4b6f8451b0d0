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
tabulates it. These are probes, not
library features: they patch the run in this process (one worker).
"""

from __future__ import annotations

import dataclasses
import json
import sys

import torch

from bayesadmm.algorithms import bayes_admm
from bayesadmm.engine import runner
from bayesadmm.experiments.config import resolve
from bayesadmm.families import DiagonalGaussian
from bayesadmm.optim import ivon
from bayesadmm.solvers.ivon import IVONSolver

VARIANTS = ("baseline", "rescale-lr", "zero-init", "keep-hess", "keep-momentum")


def rescale_lr(experiment):
    """The same algorithm with the IVON solver's step size lr·(h0 + δ)."""
    h = experiment.config.hparams
    solver = IVONSolver(lr=h["lr"], epochs=h["epochs"], batch_size=h["batch_size"], tau=h["tau"],
                        hess_init=h["hess_init"], beta2=h["beta2"],
                        cosine_rounds=experiment.config.rounds if h.get("cosine") else None, rescale_lr=True)
    algorithm = bayes_admm.make(DiagonalGaussian(experiment.model.dim), solver, rho=h["rho"], delta=h["delta"],
                                gamma=h["gamma"], name="ivon-admm")
    return dataclasses.replace(experiment, algorithm=algorithm)


def zero_init(experiment):
    return dataclasses.replace(experiment, theta0=torch.zeros_like(experiment.theta0))


def carry_over(keep):
    """A variant in which each client's IVON starts from what `keep(init_state, last_state)` takes of the state its
    previous solve ended with (the first solve of a client starts as usual)."""
    def variant(experiment):
        last_state: dict[int, ivon.IVONState] = {}
        original_solve, original_init, original_posterior = IVONSolver.solve, ivon.init, ivon.posterior

        def solve(self, family, data, lam_g, eta, rho, generator, init=None, round_=1):
            client = id(data)

            def init_from_last(mean, hess_init):
                state = original_init(mean, hess_init)
                return keep(state, last_state[client]) if client in last_state else state

            def posterior_and_keep(state, ess, delta):
                last_state[client] = state
                return original_posterior(state, ess, delta)

            ivon.init, ivon.posterior = init_from_last, posterior_and_keep
            try:
                return original_solve(self, family, data, lam_g, eta, rho, generator, init=init, round_=round_)
            finally:
                ivon.init, ivon.posterior = original_init, original_posterior

        IVONSolver.solve = solve
        return experiment
    return variant


# h clamped at 0, as init requires
keep_hess = carry_over(lambda init, last: init._replace(hess=last.hess.clamp(min=0)))
# the gradient momentum and the step count (so momentum is not debiased again), as the authors' code keeps them
keep_momentum = carry_over(lambda init, last: init._replace(momentum=last.momentum, step=last.step))


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] not in VARIANTS:
        print(__doc__)
        return 2
    variant, scenario, out, *overrides = argv
    config, _ = resolve(scenario, ["method=ivon-admm", "validation=0.1", "stop_at=10", "restart_at_q_g=false",
                                   *overrides, "workers=1",
                                   f"out={out}"])
    change = {"baseline": lambda e: e, "rescale-lr": rescale_lr, "zero-init": zero_init, "keep-hess": keep_hess,
              "keep-momentum": keep_momentum}
    build = runner.build
    runner.build = lambda c: change[variant](build(c))
    code = runner.run(config, progress=False)
    # config.json cannot say what the probe changed: record it beside
    (config.run_dir() / "probe.json").write_text(json.dumps({"variant": variant, "command": argv}) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
