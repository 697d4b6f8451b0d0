"""Several clients' minibatch gradients as one batched computation: what a cohort solver (`LocalAdam.solve_cohort`,
`IVONSolver.solve_cohort`) needs of its clients' data.

`StackedClients` holds a cohort's examples as rows of one X, y (client i of the cohort owns rows offsets[i] ..
offsets[i] + sizes[i]) with the one model and likelihood they share. `plan_batches` draws each client's shuffles from
that client's own generator, in the order `solvers.adam.minibatches` draws them (one permutation per epoch), and lays
the minibatches out as a table: row t of client i is the minibatch of its step t. `batch_gradients` then takes step t
for the active clients at once: `FlatModel.batched_gradients` of each client's mean loss (for an MLP, batched matrix
products and a written-out backward pass; for any other model `torch.func.vmap` of its gradient).

Clients of different sizes: the cohort is ordered by number of steps, most first, so the clients that take step t are
a prefix (the active set shrinks as clients finish); minibatches of different sizes in one step (an epoch's last,
smaller one, or clients smaller than one minibatch) are padded to the step's largest, and each client's loss is then
its examples' weighted sum with weights 1/(its batch size) (0 on the padding), the same mean up to rounding.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor
from torch.func import vmap

from bayesadmm import rng
from bayesadmm.clients import scaled_nll_grad, take_rows


class Workspace:
    """Scratch (K, d) matrices that a cohort solver fills anew for each cohort (its clients' parameters and moments),
    kept from cohort to cohort and round to round: fresh matrices of a cohort's size (tens of MB) come from the
    operating system as untouched pages, and faulting them in is a cost per client that does not shrink with its
    steps (it weighs most with many small clients: `python benchmarks/cohort.py`). The memory held is the largest
    cohort's matrices."""

    def __init__(self) -> None:
        self._matrices: dict[str, Tensor] = {}

    def rows(self, name: str, count: int, like: Tensor) -> Tensor:
        """The first `count` rows of matrix `name`, (count, like.numel()) in like's dtype and device; contents left
        from the last use."""
        matrix = self._matrices.get(name)
        width = like.numel()
        if (
            matrix is None
            or matrix.shape[0] < count
            or matrix.shape[1] != width
            or matrix.dtype != like.dtype
            or (matrix.device != like.device)
        ):
            matrix = torch.empty((count, width), dtype=like.dtype, device=like.device)
            self._matrices[name] = matrix
        return matrix[:count]

    def stack(self, name: str, vectors: Sequence[Tensor], like: Tensor) -> Tensor:
        """`vectors` (each 0-d or of like's shape) as the rows of matrix `name`; one broadcast copy where they are all
        one tensor (the broadcast θ_g that every client starts from)."""
        out = self.rows(name, len(vectors), like)
        if all(vector is vectors[0] for vector in vectors):
            return out.copy_(vectors[0])
        for row, vector in zip(out, vectors, strict=True):
            row.copy_(vector)
        return out


@dataclass(frozen=True)
class StackedClients:
    """A cohort's examples as rows of X, y; `clients` are their own data objects (for anything per client);
    `workspace`: the solver's scratch matrices (a fresh one per cohort where none is given)."""

    model: Any  # a FlatModel: forward(θ, X), batched_gradients(Θ, X, loss, *args)
    likelihood: Any  # mean_nll(outputs, targets)
    X: Tensor
    y: Tensor
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    clients: tuple[Any, ...]
    workspace: Workspace = field(default_factory=Workspace)

    def __len__(self) -> int:
        return len(self.sizes)


class ClientRows(NamedTuple):
    """Every client's examples as rows of one X, y on one device, with the model and likelihood they share."""

    model: Any
    likelihood: Any
    X: Tensor
    y: Tensor
    offsets: Mapping[int, int]  # client id → its first row

    def cohort(
        self, ids: Sequence[int], clients: Mapping[int, Any], workspace: Workspace | None = None
    ) -> StackedClients:
        return StackedClients(
            self.model,
            self.likelihood,
            self.X,
            self.y,
            tuple(self.offsets[k] for k in ids),
            tuple(int(clients[k].num_examples) for k in ids),
            tuple(clients[k] for k in ids),
            workspace or Workspace(),
        )


def client_rows(clients: Mapping[int, Any], source: Any = None) -> ClientRows | None:
    """The clients' examples as rows of one tensor: the source's own (a `TensorClients`: X, y, slices, no copy but
    the move to its device) or the clients' X, y concatenated once. None where the clients cannot be stacked (not
    supervised data, or not all of one model and likelihood)."""
    datas = list(clients.values())
    if not datas or not all(hasattr(d, "X") and hasattr(d, "model") and hasattr(d, "likelihood") for d in datas):
        return None
    if not hasattr(datas[0].model, "batched_gradients"):  # a FlatModel's batched gradients: see `batch_gradients`
        return None
    model, likelihood = datas[0].model, datas[0].likelihood
    if any(d.model is not model or d.likelihood != likelihood for d in datas):
        return None
    if any(d.X.shape[1:] != datas[0].X.shape[1:] or d.y.shape[1:] != datas[0].y.shape[1:] for d in datas):
        return None
    if source is not None and all(hasattr(source, a) for a in ("X", "y", "slices", "device")):
        device = datas[0].X.device
        offsets = {k: int(source.slices[k][0]) for k in clients}
        return ClientRows(model, likelihood, source.X.to(device), source.y.to(device), offsets)
    ids = list(clients)
    bounds = [0, *itertools.accumulate(int(clients[k].num_examples) for k in ids)]
    X = torch.cat([clients[k].X for k in ids])
    y = torch.cat([clients[k].y for k in ids])
    return ClientRows(model, likelihood, X, y, {k: bounds[i] for i, k in enumerate(ids)})


class BatchPlan(NamedTuple):
    """The cohort's minibatches, step by step, in the order `order` (positions in the cohort, most steps first)."""

    order: list[int]  # cohort positions, by number of steps (most first; ties in cohort order)
    steps: list[int]  # steps of each client, in `order`
    rows: Tensor  # (T, K, B) rows of X of client order[i]'s step t (0 where padded), on the data's device
    targets: Tensor  # (T, K, B, ...) the y of those rows: gathered once, not at every step
    counts: Tensor  # (K, T) examples in that minibatch (0 after the client's last step), on the CPU
    active: list[int]  # active[t]: how many clients (a prefix of `order`) take step t
    width: list[int]  # width[t]: the one minibatch size of step t's active clients, or -1 where they differ
    longest: list[int]  # longest[t]: the largest minibatch of step t (the columns a padded step computes)


def plan_batches(
    data: StackedClients, batch_size: int, epochs: int, generators: Sequence[torch.Generator], poisson: bool = False
) -> BatchPlan:
    """Each client's `epochs` shuffles from its generator (one `rng.randperm` per epoch, in epoch order, as
    `minibatches` draws them) laid out as minibatches of `batch_size`; `poisson`: each client's Poisson minibatches
    (`poisson_plan`)."""
    if poisson:
        return poisson_plan(data, batch_size, epochs, generators)
    blocks = [math.ceil(n / batch_size) for n in data.sizes]  # minibatches per epoch
    steps = [epochs * b for b in blocks]
    order = sorted(range(len(data)), key=lambda i: -steps[i])
    most = max(steps)
    rows = torch.zeros((most, len(data), batch_size), dtype=torch.int64)  # step-major: a step's rows are one block
    counts = torch.zeros((len(data), most), dtype=torch.int64)
    for slot, i in enumerate(order):
        n, b = data.sizes[i], blocks[i]
        table = torch.zeros((epochs, b * batch_size), dtype=torch.int64)
        for epoch in range(epochs):  # drawn on the CPU generator as `minibatches` draws them
            table[epoch, :n] = rng.randperm(n, generators[i], "cpu")
        rows[: steps[i], slot] = table.add_(data.offsets[i]).view(epochs * b, batch_size)
        sizes = torch.full((b,), batch_size, dtype=torch.int64)
        sizes[-1] = n - (b - 1) * batch_size
        counts[slot, : epochs * b] = sizes.repeat(epochs)
    return _plan(data, order, [steps[i] for i in order], rows, counts)


def poisson_minibatches(
    num_examples: int, batch_size: int, epochs: int, generator: torch.Generator, device: torch.device | str = "cpu"
) -> Iterator[Tensor]:
    """Example-level DP's minibatches (Poisson sampling, which its accountant analyses): ⌈N / B⌉ steps an epoch, each
    step's minibatch every example independently with probability q = min(1, B / N), from one uniform draw per
    example and step (`rng.rand`), in index order. The size varies, qN = min(B, N) on average, and may be 0."""
    rate = min(1.0, batch_size / num_examples)
    for _ in range(epochs * math.ceil(num_examples / batch_size)):
        yield (rng.rand(num_examples, generator, "cpu") < rate).nonzero().flatten().to(device)


def poisson_plan(
    data: StackedClients, batch_size: int, epochs: int, generators: Sequence[torch.Generator]
) -> BatchPlan:
    """Each client's Poisson minibatches (`poisson_minibatches`: ⌈N_k / B⌉ · epochs steps, each example
    in each step with probability min(1, B / N_k)), drawn from its generator as that function draws them, laid out
    as minibatches as wide as the largest (a step may hold none: its count is 0)."""
    steps = [epochs * math.ceil(n / batch_size) for n in data.sizes]
    order = sorted(range(len(data)), key=lambda i: -steps[i])
    drawn = [list(poisson_minibatches(data.sizes[i], batch_size, epochs, generators[i])) for i in order]
    widest = max(1, max(len(batch) for batches in drawn for batch in batches))
    rows = torch.zeros((max(steps), len(data), widest), dtype=torch.int64)
    counts = torch.zeros((len(data), max(steps)), dtype=torch.int64)
    for slot, (i, batches) in enumerate(zip(order, drawn, strict=True)):
        for t, batch in enumerate(batches):
            rows[t, slot, : len(batch)] = batch + data.offsets[i]
            counts[slot, t] = len(batch)
    return _plan(data, order, [steps[i] for i in order], rows, counts)


def _plan(data: StackedClients, order: list[int], ordered_steps: list[int], rows: Tensor, counts: Tensor) -> BatchPlan:
    """The plan of the minibatch table `rows` (T, K, B) with their sizes `counts` (K, T), in the order `order`."""
    most = rows.shape[0]
    active = [sum(1 for s in ordered_steps if s > t) for t in range(most)]
    width, longest = [], []
    for t in range(most):
        column = counts[: active[t], t]
        width.append(int(column[0]) if bool((column == column[0]).all()) else -1)
        longest.append(int(column.max()))
    rows = rows.to(data.X.device)
    return BatchPlan(order, ordered_steps, rows, take_rows(data.y, rows), counts, active, width, longest)


def _weighted_nll(likelihood, outputs: Tensor, y: Tensor, w: Tensor) -> Tensor:
    """One client's Σ over examples of w × the example's loss (w: 1/(its minibatch's size), 0 on the padding)."""
    per_example = vmap(lambda o, t: likelihood.mean_nll(o.unsqueeze(0), t.unsqueeze(0)))(outputs, y)
    return (per_example * w).sum()


class CohortGradients(Protocol):
    def __call__(self, data: StackedClients, plan: BatchPlan, t: int, thetas: Tensor) -> Tensor:
        """(A, S, d): each of the A = plan.active[t] first clients' minibatch gradients of step t at its S samples
        thetas (A, S, d)."""


def batch_gradients(data: StackedClients, plan: BatchPlan, t: int, thetas: Tensor) -> Tensor:
    """∇ of each active client's mean loss over its minibatch of step t, at its parameters: thetas (A, S, d) for the
    A = plan.active[t] first clients of the plan and S samples each; returns (A, S, d), in the workspace's
    "gradients" matrix (overwritten by the next call)."""
    active, samples, dim = thetas.shape
    width = plan.width[t]
    # the one minibatch size, or padded to the step's largest minibatch where they differ (not to the batch size:
    # clients smaller than one minibatch would compute mostly padding)
    cut = plan.longest[t]
    rows, y = plan.rows[t, :active, :cut], plan.targets[t, :active, :cut]  # (A, b)
    if samples > 1:
        rows, y = rows.repeat_interleave(samples, dim=0), y.repeat_interleave(samples, dim=0)
    x = take_rows(data.X, rows)
    flat = thetas.reshape(active * samples, dim)
    out = data.workspace.rows("gradients", active * samples, flat[0])
    nll_grad = getattr(data.likelihood, "nll_grad", None)  # the loss's gradient in closed form, where it has one
    if width > 0:
        mean_grad = None if nll_grad is None else functools.partial(scaled_nll_grad, nll_grad, 1.0 / width)
        grads = data.model.batched_gradients(flat, x, data.likelihood.mean_nll, y, out=out, loss_grad=mean_grad)
    else:
        counts = plan.counts[:active, t].to(thetas.device, thetas.dtype)
        mask = torch.arange(rows.shape[1], device=thetas.device)[None, :] < counts[:, None]
        weights = mask.to(thetas.dtype) / counts[:, None]
        if samples > 1:
            weights = weights.repeat_interleave(samples, dim=0)
        loss = functools.partial(_weighted_nll, data.likelihood)
        grads = data.model.batched_gradients(flat, x, loss, y, weights, out=out, loss_grad=nll_grad)
    return grads.view(active, samples, dim)
