"""Optimisers: IVON with a per-coordinate prior and BayesADMM dual terms (`ivon`).

`IVON` is the torch.optim.Optimizer (`optimizer`); `init`, `noise_scale`, `sample`, `update`, `posterior` over
`IVONState` are the functional core it is built on (`ivon`: flat 1-D tensors, pure functions), used directly by the
federated local solver.
"""

from bayesadmm.optim import ivon
from bayesadmm.optim.ivon import IVONState, init, noise_scale, posterior, sample, update, update_and_sample
from bayesadmm.optim.optimizer import IVON

__all__ = ["ivon", "IVON", "IVONState", "init", "noise_scale", "sample", "update", "update_and_sample", "posterior"]
