"""What a local solver needs of a client's data (`ClientData`), supervised data of a model and a likelihood
(`SupervisedData`), and the picklable client sources the engine builds clients from (`TensorClients`,
`ClientObjects`).

A client source is a callable `source(k) -> ClientData` with a `sizes` mapping (client id → number of examples). The
engine calls it once per client in the process that trains that client: in this process, or in each worker process,
which receives the source by pickling. `TensorClients` keeps every client's examples as rows of one client-ordered
tensor, so worker processes share two tensors in memory (torch pickles CPU tensors for a worker into shared memory)
instead of two per client.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from bayesadmm.likelihoods import Classification, Likelihood
from bayesadmm.models import FlatModel
from bayesadmm.trees import hash_tensors

__all__ = ["ClientData", "ClientSource", "SupervisedData", "TensorClients", "ClientObjects", "fingerprint"]


@runtime_checkable
class ClientData(Protocol):
    """One client's data as its local solver sees it: the number of examples and the mean loss of a minibatch.

    The client's loss is the SUM of its per-example negative log-likelihoods, `num_examples × batch_loss(θ, all)`;
    solvers that weigh the prior and the likelihood (IVON, VON, the Laplace methods) rely on that scaling.
    """

    @property
    def num_examples(self) -> int: ...

    def batch_loss(self, theta: Tensor, idx: Tensor) -> Tensor:
        """Mean negative log-likelihood of the examples `idx` under the flat parameters `theta` (differentiable).
        A client may also have `batch_grad(theta, idx)`, this loss's gradient, which the per-client solvers then
        use instead of autograd (`SupervisedData.batch_grad`)."""
        ...


@dataclass(frozen=True)
class SupervisedData:
    """Inputs X (n, ...) and targets y (n, ...) of one client, the model mapping a flat θ and X to outputs, and the
    likelihood of y given those outputs. Methods that look at the inputs themselves (FedLap-Cov's curvature,
    FedLap-Func's memory points, FedEP's Laplace inference) read `model`, `X` and `y`."""

    model: FlatModel
    X: Tensor
    y: Tensor
    likelihood: Likelihood = field(default_factory=Classification)

    def __post_init__(self) -> None:
        if self.X.shape[0] != self.y.shape[0]:
            raise ValueError(f"X has {self.X.shape[0]} examples but y has {self.y.shape[0]}")

    @property
    def num_examples(self) -> int:
        return self.y.shape[0]

    def batch_loss(self, theta: Tensor, idx: Tensor) -> Tensor:
        """The likelihood's mean negative log-likelihood over the examples `idx`."""
        return self.likelihood.mean_nll(self.model.forward(theta, take_rows(self.X, idx)), take_rows(self.y, idx))

    def batch_grad(self, theta: Tensor, idx: Tensor) -> Tensor:
        """∇θ of `batch_loss(θ, idx)`, a new tensor. A model run from its plan with a likelihood that has `nll_grad`
        takes the written-out backward pass (`FlatModel.batched_gradients` of one row), which builds no autograd
        graph (`python benchmarks/batched_gradients.py`: its "one client" line); any other by autograd."""
        nll_grad = getattr(self.likelihood, "nll_grad", None)
        if nll_grad is None or not getattr(self.model, "written_out_backward", False):
            leaf = theta.detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(self.batch_loss(leaf, idx), leaf)
            return grad
        x, y = take_rows(self.X, idx).unsqueeze(0), take_rows(self.y, idx).unsqueeze(0)
        mean_grad = functools.partial(scaled_nll_grad, nll_grad, 1.0 / idx.numel())
        thetas = theta.detach().unsqueeze(0)
        return self.model.batched_gradients(thetas, x, self.likelihood.mean_nll, y, loss_grad=mean_grad)[0]


def scaled_nll_grad(nll_grad, weight: float, outputs: Tensor, targets: Tensor) -> Tensor:
    """`nll_grad` with one weight for every example (1/N: the gradient of a minibatch's mean loss), as
    `FlatModel.batched_gradients` takes a `loss_grad` (here and in `solvers.cohort`)."""
    return nll_grad(outputs, targets, weight)


def take_rows(t: Tensor, idx: Tensor) -> Tensor:
    """t[idx]; for a tensor of integer indices (any shape) by index_select of them flattened, a few times faster than
    indexing on a CPU (the same values)."""
    if isinstance(idx, Tensor) and not idx.is_floating_point() and idx.dtype != torch.bool:
        return torch.index_select(t, 0, idx.reshape(-1)).view(*idx.shape, *t.shape[1:])
    return t[idx]


class ClientSource(Protocol):
    """A picklable description of the clients: `source(k)` builds client k's data where it is trained."""

    @property
    def sizes(self) -> Mapping[int, int]: ...

    def __call__(self, client: int) -> ClientData: ...


@dataclass(frozen=True)
class TensorClients:
    """The clients' examples as consecutive rows of `X`, `y` (client k owns rows `slices[k]`); each client is a
    `SupervisedData` view of its rows, moved to `device` (a no-op where the tensors already are)."""

    model: FlatModel
    X: Tensor
    y: Tensor
    slices: Mapping[int, tuple[int, int]]
    likelihood: Likelihood = field(default_factory=Classification)
    device: str = "cpu"

    @property
    def sizes(self) -> dict[int, int]:
        return {k: b - a for k, (a, b) in self.slices.items()}

    def __call__(self, client: int) -> SupervisedData:
        a, b = self.slices[client]
        return SupervisedData(self.model, self.X[a:b].to(self.device), self.y[a:b].to(self.device), self.likelihood)

    @classmethod
    def from_parts(
        cls,
        model: FlatModel,
        parts: Mapping[int, tuple[Tensor, Tensor]],
        likelihood: Likelihood | None = None,
        device: str = "cpu",
    ) -> TensorClients:
        """Clients given as (X_k, y_k) pairs by id, concatenated in id order."""
        ids = sorted(parts)
        if not ids:
            raise ValueError("there are no clients")
        xs, ys = [parts[k][0] for k in ids], [parts[k][1] for k in ids]
        for k, x, y in zip(ids, xs, ys, strict=True):
            if x.shape[0] != y.shape[0]:
                raise ValueError(f"client {k}: X has {x.shape[0]} examples but y has {y.shape[0]}")
            if x.shape[0] == 0:
                raise ValueError(f"client {k} has no examples")
            if x.shape[1:] != xs[0].shape[1:] or y.shape[1:] != ys[0].shape[1:]:
                raise ValueError(
                    f"client {k}'s examples have shape {tuple(x.shape[1:])} → {tuple(y.shape[1:])}, "
                    f"client {ids[0]}'s {tuple(xs[0].shape[1:])} → {tuple(ys[0].shape[1:])}"
                )
        bounds = torch.tensor([0] + [x.shape[0] for x in xs]).cumsum(0).tolist()
        slices = {k: (bounds[i], bounds[i + 1]) for i, k in enumerate(ids)}
        return cls(model, torch.cat(xs), torch.cat(ys), slices, likelihood or Classification(), device)


@dataclass(frozen=True)
class ClientObjects:
    """Clients given as ready `ClientData` objects by id; pickled whole to every worker process."""

    clients: Mapping[int, Any]

    @property
    def sizes(self) -> dict[int, int]:
        return {k: int(data.num_examples) for k, data in self.clients.items()}

    def __call__(self, client: int) -> Any:
        return self.clients[client]


def client_ids(clients: Iterable) -> list[int]:
    """Client ids must be non-negative ints below 10⁹ (the generators of (seed, round, client) are derived from them;
    ids from 10⁹ on are the engine's own random streams)."""
    ids = list(clients)
    for k in ids:
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < 10**9:
            raise ValueError(f"client ids must be integers in [0, 10⁹), got {k!r}")
    return ids


def fingerprint(source: Any) -> dict:
    """What a checkpoint records of the clients' data, so that a resume with other data is refused: the clients'
    sizes and, where the source holds the examples as tensors (`TensorClients`, `ClientObjects` of `X`/`y` data), the
    sha256 of their bytes, all of them ("sha256") and each client's ("client_sha256", by id: what a run without a
    client, `bayesadmm.unlearn(..., out=)`, keeps of it). Two passes over the data: FashionMNIST's training set takes
    a fraction of a second."""
    sizes = {str(k): int(n) for k, n in sorted(source.sizes.items())}
    if isinstance(source, TensorClients):
        tensors = [source.X, source.y]
        per_client = {k: [source.X[a:b], source.y[a:b]] for k, (a, b) in source.slices.items()}
    elif isinstance(source, ClientObjects):
        per_client = {}
        for k in sorted(source.clients):
            X, y = getattr(source.clients[k], "X", None), getattr(source.clients[k], "y", None)
            if not (isinstance(X, Tensor) and isinstance(y, Tensor)):
                return {"sizes": sizes}  # a client of the user's own kind: its sizes are what can be checked
            per_client[k] = [X, y]
        tensors = [t for k in sorted(per_client) for t in per_client[k]]
    else:
        return {"sizes": sizes}
    each = {str(k): hash_tensors(hashlib.sha256(), per_client[k]).hexdigest() for k in sorted(per_client)}
    return {"sizes": sizes, "sha256": hash_tensors(hashlib.sha256(), tensors).hexdigest(), "client_sha256": each}
