"""Models as functions of one flat parameter vector (`FlatModel`) and the architectures of the experiments."""

from .functional import FlatModel, mean_nll
from .zoo import MODELS, logistic, make_model, mlp

__all__ = ["FlatModel", "mean_nll", "MODELS", "make_model", "mlp", "logistic"]
