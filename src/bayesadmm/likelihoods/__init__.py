r"""Likelihoods ``p(y | f(x; θ))``: the training loss of a model's outputs and the metrics of its predictions.

A ``Likelihood`` is three pure functions of tensors, so the training loop and ``bayesadmm.evaluation.metrics.evaluate``
work for any observation model:

    mean_nll(F, Y)    = (1/N) Σ_i −log p(y_i | f_i)                   the training loss, differentiable in F
    predictive(F)     = a per-example summary of S draws f_{s,i}      concatenated over evaluation batches (dim 0)
    metrics(P, Y)     = the metrics of the whole evaluation set       from the concatenated summaries

with ``F`` the model outputs of ``N`` examples (``(N, ...)`` for ``mean_nll``, ``(S, N, ...)`` under ``S`` parameter
draws for ``predictive``, ``S = 1`` at the posterior mean).  A likelihood may also give the loss's gradient in closed
form, which cohort training (``solvers.cohort``) then uses instead of autograd at every local step:

    nll_grad(F, Y, W) = ∂/∂F Σ_i w_i (−log p(y_i | f_i))               optional; ``Classification`` has it

Second-order and function-space methods need more than the loss. The optional protocol ``CurvatureLikelihood`` adds,
for the outputs ``F (N, C)`` of ``N`` examples flattened to ``C`` numbers each,

    output_hessian(F)       = ∇²_f (−log p(y | f_i)), (N, C, C)   Λ_i of the GGN Σ_i J_iᵀ Λ_i J_i (FedLap-Cov's "ggn")
    sample_targets(F, gen)  = ŷ_i ∼ p(y | f_i)                    the sampled-target Fisher (FedLap-Cov's "mc-fisher";
                                                                 FedEP/FedSEP/FedPA's Laplace and NGVI inference)
    soft_targets(F)         = E[y | f_i]                          FedLap-Func's soft labels ŷ_i

``Classification`` (softmax: ``diag(p) − ppᵀ``), ``GaussianRegression`` (``I / noise²``) and ``Poisson`` (log link:
``diag(exp f)``) have all three; ``NegLogLikelihood`` those it is given. All three are canonical-link exponential
families, ``−log p(y | f) = A(f) − yᵀf + c(y)``, so the Hessian ``∇²A(f)`` does not depend on ``y`` and is also the
Fisher, and ``mean_nll(·, soft_targets(f))`` is smallest at ``f`` (its gradient ``∇A(f) − E[y | f]`` vanishes), which
is what FedLap-Func's fixed points rely on. A method that needs one of them checks for it with ``require`` when it is
built, so a likelihood without it is refused before training, never silently replaced by the softmax's.

The GGN consumes a factor ``L_i L_iᵀ = Λ_i`` of each output Hessian, which a likelihood may give in closed form,

    output_hessian_factor(F)  = L, (N, C, K)                          optional; else the symmetric square root

as the built-in three do (softmax: columns ``√p_c (p − e_c)``, accurate however small ``p_c``, where the
eigenvectors of a nearly degenerate ``Λ_i`` are not).

A likelihood of class labels with ``bins`` confidence bins (``ConfidenceLikelihood``: ``Classification``) also has
its reliability diagram drawn at the end of a run; the run asks for ``bins``, not for the class.

The implementations are frozen dataclasses of plain values, so they pickle into worker processes; names such as
``"gaussian"`` are mapped to them by the config layer.

``GaussianRegression``, ``Poisson`` and ``NegLogLikelihood`` score the posterior predictive as the exact mixture
``(1/S) Σ_s p(y | f_s)`` through ``logsumexp``, which stays finite where the individual densities underflow.

The protocols and ``require`` are in ``likelihoods.base``, ``Classification`` in ``likelihoods.classification``,
``GaussianRegression`` and ``Poisson`` in ``likelihoods.regression``, ``NegLogLikelihood`` in
``likelihoods.custom``; every public name is importable from here.
"""

from __future__ import annotations

from bayesadmm.likelihoods.base import (
    CURVATURE_MEMBERS,
    ConfidenceLikelihood,
    CurvatureLikelihood,
    Likelihood,
    MissingCurvatureError,
    require,
)
from bayesadmm.likelihoods.classification import Classification
from bayesadmm.likelihoods.custom import NegLogLikelihood
from bayesadmm.likelihoods.regression import COVERAGE_LEVELS, GaussianRegression, Poisson

# the built-in likelihoods by the name every door gives them (`bayesadmm run`'s likelihood=, a Flower run config's,
# a run record's `runspec.LikelihoodSpec`)
LIKELIHOODS: dict[str, type] = {
    "classification": Classification,
    "gaussian": GaussianRegression,
    "poisson": Poisson,
}

__all__ = [
    "LIKELIHOODS",
    "COVERAGE_LEVELS",
    "CURVATURE_MEMBERS",
    "Classification",
    "ConfidenceLikelihood",
    "CurvatureLikelihood",
    "GaussianRegression",
    "Likelihood",
    "NegLogLikelihood",
    "MissingCurvatureError",
    "Poisson",
    "require",
]
