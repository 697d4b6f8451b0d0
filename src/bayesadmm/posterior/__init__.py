"""The posterior of a run: the artefact, its file and unlearning.

``artefact`` is ``bayesadmm.Posterior`` (a trained posterior over a model's flat parameters with the model's layout:
``GaussianPosterior``, ``PointPosterior``), ``file`` its one safetensors file (``encode``/``decode``, checksummed),
``unlearning`` ``bayesadmm.unlearn`` (a finished run's posterior without one client's term). This package's front
holds the artefact's names; ``unlearn`` is imported from ``posterior.unlearning`` (it loads runs, and so builds on the
engine, which itself holds a run's posterior).
"""

from bayesadmm.posterior.artefact import GaussianPosterior, PointPosterior, Posterior, layout_mismatch, layout_of
from bayesadmm.posterior.file import PosteriorFileError

__all__ = ["Posterior", "GaussianPosterior", "PointPosterior", "PosteriorFileError", "layout_of", "layout_mismatch"]
