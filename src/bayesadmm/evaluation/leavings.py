"""What the evaluation leaves in a run's directory when the run ends: curves.png (the metrics per round) and, for a
likelihood with confidence bins (`likelihoods.ConfidenceLikelihood`), its reliability diagram (reliability.json and
.png). `leave` is the engine's one call into evaluation and reporting; the posterior file is the posterior's
(`posterior.artefact.save_posterior`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bayesadmm.engine.federation import EVALUATION, Federation
from bayesadmm.engine.settings import Settings
from bayesadmm.engine.simulate import generator_for
from bayesadmm.evaluation import diagrams
from bayesadmm.evaluation.metrics import evaluate_uncertainty
from bayesadmm.likelihoods import ConfidenceLikelihood

__all__ = ["leave", "write_reliability"]


def leave(
    run_dir: Path,
    federation: Federation,
    settings: Settings,
    round_: int,
    history: Sequence[dict],
    posterior: Callable[[], Any],
    title: str = "",
) -> None:
    """Write curves.png of `history` (`diagrams.try_plot_run`) and, where the federation's likelihood has confidence
    bins, reliability.json and .png of the posterior of round `round_` (`write_reliability`) into `run_dir`.
    `posterior()` gives the run's posterior; it is asked for only where a diagram is drawn. A failure to plot or to
    write a file is reported on stderr, not raised: a plot is never worth losing a run's status."""
    diagrams.try_plot_run(list(history), run_dir / "curves.png", title=title)
    write_reliability(run_dir, federation, posterior, round_, settings, title)


def write_reliability(
    run_dir: Path,
    federation: Federation,
    posterior: Callable[[], Any],
    round_: int,
    settings: Settings,
    title: str,
) -> None:
    """reliability.json and .png of the posterior of round `round_` (its last evaluation), with that evaluation's
    draws (the same generator), so that their ECEs are the logged ones; nothing for a likelihood without confidence
    bins (`ConfidenceLikelihood`) or a federation without an evaluation set."""
    likelihood = federation.likelihood
    if not isinstance(likelihood, ConfidenceLikelihood) or federation.eval_X is None or federation.eval_y is None:
        return
    report = evaluate_uncertainty(
        federation.model,
        posterior(),
        federation.eval_X,
        federation.eval_y,
        federation.ood_X,
        samples=settings.eval_samples,
        generator=generator_for(settings.seed, round_, EVALUATION),
        bins=likelihood.bins,
    )
    diagrams.write_reliability(run_dir, {"round": round_, "eval_set": federation.eval_set, **report}, title)
