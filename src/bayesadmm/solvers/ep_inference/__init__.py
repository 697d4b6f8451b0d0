"""Tilted inference for FedEP's clients (Guo et al. 2023, Sec. 2.2.2): one object per method, each a
`TiltedInference` (`tilted.py`) for `algorithms.fedep.make`, `fedsep.make` and `fedpa.make`, whose client steps call
it through `TiltedSolver` (the local-solver interface, `solve_problem`).

    I  ScaledIdentity:  mean = argmin L̄_k by LocalAdam;  Λ̂ = Λ_{−k} + α n_k
    L  Laplace:         mean as I;  Λ̂ = Λ_{−k} + H_k + α n_k, H_k the sampled-target diagonal Fisher
    M  SGMCMC:          mean and shrunk variance of one SGD(momentum) sample per epoch (Alg. 2), rescaled
    V  NGVI:            mean as I;  Λ̂ = Λ_{−k} + n_k s + α n_k, s the running average Fisher (Alg. 5)
    ExactGaussian:      closed-form tilted distribution of a Gaussian likelihood (the toy of Sec. 3.1)

I, L, M and V use the diagonal family and a network's data with any likelihood (`clients.SupervisedData`); L and V
draw targets from the likelihood for their Fisher (its `sample_targets`, listed in their `needs`, which the registry
checks when it builds the method: `likelihoods.require`). L̄_k is the tilted objective in mean-loss units
(`tilted.py`). Each module gives its method's equations.
"""

from bayesadmm.solvers.ep_inference.exact import ExactGaussian, GaussianLikelihood
from bayesadmm.solvers.ep_inference.laplace import Laplace, diagonal_fisher
from bayesadmm.solvers.ep_inference.ngvi import NGVI
from bayesadmm.solvers.ep_inference.scaled_identity import ScaledIdentity
from bayesadmm.solvers.ep_inference.sgmcmc import SGMCMC, clip_and_rescale, sgd_chain, shrunk_moments
from bayesadmm.solvers.ep_inference.tilted import (
    TiltedInference,
    TiltedProblem,
    TiltedSolver,
    cavity_precision,
    likelihood_needs,
    tilted_mean,
)

__all__ = [
    "NGVI",
    "SGMCMC",
    "ExactGaussian",
    "GaussianLikelihood",
    "Laplace",
    "ScaledIdentity",
    "TiltedInference",
    "TiltedProblem",
    "TiltedSolver",
    "cavity_precision",
    "clip_and_rescale",
    "diagonal_fisher",
    "likelihood_needs",
    "sgd_chain",
    "shrunk_moments",
    "tilted_mean",
]
