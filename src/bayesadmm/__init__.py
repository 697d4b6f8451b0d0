"""bayesadmm: Bayesian federated learning (BayesADMM and baselines)."""

__version__ = "0.1.0"
