"""bayesadmm: Bayesian federated learning in PyTorch (BayesADMM and the methods it is measured against).

The public API:

    bayesadmm.run(model, clients, test, algorithm=..., hparams=..., likelihood=..., rounds=..., ...)  -> Result
    bayesadmm.load(run_dir, model=..., likelihood=...) -> Result                  a finished run, read back
    bayesadmm.Posterior: result.posterior, .save(path), Posterior.load(path), .to_module(m), .predict(m, x)
    bayesadmm.personal(result, k), evaluate_personal(...), FineTune(epochs)    client k's personal posterior, scored
    bayesadmm.unlearn(result_or_run_dir, client_id)                  -> Result without that client's term
    bayesadmm.Classification(), GaussianRegression(noise), Poisson(), NegLogLikelihood(fn)           likelihoods
    bayesadmm.algorithms.names(), .register(MethodSpec(...)), .make(name, **hparams), bayesadmm.Algorithm   methods
    bayesadmm.ClientData, SupervisedData, DataError                                                  client data
    bayesadmm.FlatModel                                                                              a module as f(θ, x)
    bayesadmm.evaluate(...), evaluate_uncertainty(model, posterior, X, y, ood), bayesadmm.uncertainty      metrics
    bayesadmm.trees.register(MyState)                                          a state class of one's own, storable
    bayesadmm.optim.IVON                                                                             a torch optimizer
    bayesadmm.Federation, Settings, run_federation                                                   the engine's loop
    bayesadmm.RunSpec.of(method, hparams, ...), assemble(spec, model, sizes)              a run's record, its algorithm
    bayesadmm.DPSettings(level, clip, noise_multiplier, epsilon, delta), BudgetExhausted      differential privacy
"""

from bayesadmm import algorithms, trees
from bayesadmm.algorithms import Algorithm, DivergenceError, PointEstimate
from bayesadmm.clients import ClientData, SupervisedData, TensorClients
from bayesadmm.engine.federation import Federation, Result
from bayesadmm.engine.loop import run_federation
from bayesadmm.engine.personal import FineTune, evaluate_personal, personal
from bayesadmm.engine.settings import Settings
from bayesadmm.engine.simulate import generator_for
from bayesadmm.evaluation import uncertainty
from bayesadmm.evaluation.metrics import evaluate, evaluate_uncertainty
from bayesadmm.federated import algorithm_factory, assemble, run
from bayesadmm.likelihoods import (
    Classification,
    CurvatureLikelihood,
    GaussianRegression,
    Likelihood,
    NegLogLikelihood,
    Poisson,
)
from bayesadmm.loading import load
from bayesadmm.models import FlatModel
from bayesadmm.posterior.artefact import GaussianPosterior, PointPosterior, Posterior
from bayesadmm.posterior.file import PosteriorFileError
from bayesadmm.posterior.unlearning import UnlearningError, unlearn
from bayesadmm.privacy import BudgetExhausted, DPSettings
from bayesadmm.runspec import RunSpec
from bayesadmm.userdata import DataError

__version__ = "0.1.0"

__all__ = [
    "run",
    "load",
    "unlearn",
    "UnlearningError",
    "Result",
    "Posterior",
    "GaussianPosterior",
    "PointPosterior",
    "PosteriorFileError",
    "algorithm_factory",
    "assemble",
    "RunSpec",
    "algorithms",
    "trees",
    "Algorithm",
    "DivergenceError",
    "PointEstimate",
    "ClientData",
    "SupervisedData",
    "TensorClients",
    "DataError",
    "Likelihood",
    "CurvatureLikelihood",
    "Classification",
    "GaussianRegression",
    "Poisson",
    "NegLogLikelihood",
    "FlatModel",
    "Federation",
    "Settings",
    "run_federation",
    "generator_for",
    "evaluate",
    "personal",
    "evaluate_personal",
    "FineTune",
    "evaluate_uncertainty",
    "uncertainty",
    "DPSettings",
    "BudgetExhausted",
]
