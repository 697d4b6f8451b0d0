"""What a run leaves in its directory when it ends, besides its metrics and checkpoint: the posterior file
(posterior.safetensors, for whoever only predicts) and, for a classifier, its reliability diagram
(reliability.json and .png)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from bayesadmm.engine.federation import EVALUATION, Federation, Result
from bayesadmm.engine.rundir import POSTERIOR
from bayesadmm.engine.settings import Settings
from bayesadmm.engine.simulate import generator_for
from bayesadmm.evaluation.diagrams import write_reliability as write_diagram
from bayesadmm.evaluation.metrics import evaluate_uncertainty
from bayesadmm.likelihoods import Classification
from bayesadmm.posterior.artefact import Posterior

__all__ = ["save_posterior", "write_reliability"]


def save_posterior(result: Result) -> None:
    """posterior.safetensors: the run's posterior (the last good state), so that the run directory can be handed to
    someone who only predicts. A user's algorithm whose posterior is not a Gaussian or a point estimate has none."""
    try:
        posterior = result.posterior
    except ValueError as exc:  # a user's algorithm whose posterior is not over the model's parameters
        warnings.warn(f"the run wrote no {POSTERIOR}: {exc}", stacklevel=2)
        return
    if isinstance(posterior, Posterior):
        posterior.save(result.run_dir / POSTERIOR)


def write_reliability(
    run_dir: Path, federation: Federation, posterior: Any, round_: int, settings: Settings, title: str
) -> None:
    """reliability.json and .png of a classifier's posterior of round `round_` (its last evaluation), with that
    evaluation's draws (the same generator), so that their ECEs are the logged ones; nothing for other likelihoods."""
    if not isinstance(federation.likelihood, Classification) or federation.eval_X is None or federation.eval_y is None:
        return
    report = evaluate_uncertainty(
        federation.model,
        posterior,
        federation.eval_X,
        federation.eval_y,
        federation.ood_X,
        samples=settings.eval_samples,
        generator=generator_for(settings.seed, round_, EVALUATION),
        bins=federation.likelihood.bins,
    )
    write_diagram(run_dir, {"round": round_, "eval_set": federation.eval_set, **report}, title)
