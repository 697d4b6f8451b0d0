"""A user's data made tensors (`as_tensors`) and checked against the model and the likelihood (`check_data`,
`check_client_objects`) before a run writes anything.

`bayesadmm.run` checks every client and the test set, and a Flower SuperNode its own data, so that data the model
or the likelihood cannot take is one clear error naming the client and the fix, raised before the run directory
exists, instead of a torch error deep in round 1 (or a NaN reported as a divergence). The rules, which
docs/guides/own-model.md ("What your data must look like") states for users:

* X and y have one row per example, at least one, and every client's examples have the same shape;
* features are real numbers. Floats are kept (the model computes in its parameters' dtype, `FlatModel.forward`);
  integer or bool features (uint8 pixels) are cast to the parameters' dtype, values unchanged, unless the model
  takes them as they are (token ids into an `nn.Embedding`), which one forward pass on the first client decides;
* no feature is NaN or infinite, nor a target of `Classification` or `GaussianRegression`;
* `Classification`: labels are class indices of shape (N,) of any integer dtype (uint8, int32, bool...), cast to
  int64, in 0..C−1 for a model with C outputs (logits of shape (N, C)). Float labels and one-hot or probability
  rows are refused with the cast that fixes them: the metrics, FedLap-Func's memory points and the Laplace
  methods' curvature all read class indices, so soft targets would train but not be scored or approximated;
* `GaussianRegression`: the model's outputs per example (a trailing 1 squeezed) have the targets' shape;
* any likelihood (`NegLogLikelihood(fn)` and your own included): its loss on each client's first examples, at the
  initial parameters, runs and is a finite scalar.

The model sees `PER_CLIENT` examples of every client and of the test set, in one batch (in chunks of `CHUNK` rows),
so 10,000 clients cost one forward pass of 20,000 rows; only when that fails is it repeated client by client, to name
the client. The checks of whole clients (finite values, label range) are one reduction per tensor.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, overload

import torch
from torch import Tensor

from bayesadmm.checks import all_finite
from bayesadmm.likelihoods import Classification, GaussianRegression, Likelihood, NegLogLikelihood
from bayesadmm.models import FlatModel

__all__ = ["DataError", "as_tensors", "check_data", "check_inputs", "check_client_objects", "PER_CLIENT"]

PER_CLIENT = 2  # examples of each client the model and the likelihood are tried on
CHUNK = 4096  # rows per forward pass of the check, bounding its memory whatever the number of clients

Pair = tuple[Tensor, Tensor]
TEST = "the test set"


class DataError(ValueError):
    """The data does not fit the model or the likelihood: one line naming where (the client), what and the fix."""


def as_tensors(data: Any, what: str) -> Pair:
    """(X, y) from an (X, y) pair of tensors or array-likes (numpy arrays, lists of numbers: what `torch.as_tensor`
    takes), or from a map-style `torch.utils.data.Dataset` of (x, y) pairs, read whole and stacked.

    A tuple or list of two elements is a pair when both convert to tensors with a row per example; otherwise it is
    read as a dataset of two (x, y) items."""
    if isinstance(data, (tuple, list)) and len(data) == 2:
        pair = _array_pair(data)
        if pair is not None:
            return pair
    if not isinstance(data, (str, bytes, Mapping)) and hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        items: Sequence = [data[i] for i in range(len(data))]
        if not items:
            raise DataError(f"{what} is an empty dataset; give it at least one example, or leave it out")
        if not all(isinstance(item, (tuple, list)) and len(item) == 2 for item in items):
            raise DataError(
                f"{what}: a dataset's items must be (input, target) pairs, got {type(items[0]).__name__}; "
                "give an (X, y) pair or a Dataset of (x, y) pairs"
            )
        try:
            xs = torch.stack([torch.as_tensor(item[0]) for item in items])
            return xs, torch.stack([torch.as_tensor(item[1]) for item in items])
        except (RuntimeError, TypeError, ValueError) as exc:
            raise DataError(
                f"{what}: its items do not stack into tensors ({_first_line(exc)}); give every example one shape"
            ) from None
    raise TypeError(
        f"{what} must be an (X, y) pair of tensors or arrays, or a Dataset of (x, y) pairs, got {type(data).__name__}"
    )


def _array_pair(data: Sequence) -> Pair | None:
    """(X, y) if both elements are tensors or convert to tensors of at least one dimension, else None. A list or
    tuple holding tensors is an (x, y) item of a dataset, not an array."""
    if any(isinstance(t, (tuple, list)) and any(isinstance(v, Tensor) for v in t) for t in data):
        return None
    converted = [_tensor(t) for t in data]
    if any(t is None or t.dim() == 0 for t in converted):
        return None
    return converted[0], converted[1]


def _tensor(value: Any) -> Any:
    """`torch.as_tensor(value)` (no copy of a tensor or a numpy array), None where it does not convert."""
    if isinstance(value, Tensor):
        return value
    try:
        return torch.as_tensor(value)
    except (RuntimeError, TypeError, ValueError):
        return None


@overload
def check_data(
    model: FlatModel, theta: Tensor, likelihood: Likelihood, clients: Mapping[int, Pair], test: Pair
) -> tuple[dict[int, Pair], Pair]: ...


@overload
def check_data(
    model: FlatModel, theta: Tensor, likelihood: Likelihood, clients: Mapping[int, Pair], test: None = None
) -> tuple[dict[int, Pair], None]: ...


def check_data(
    model: FlatModel, theta: Tensor, likelihood: Likelihood, clients: Mapping[int, Pair], test: Pair | None = None
) -> tuple[dict[int, Pair], Pair | None]:
    """The clients' (X, y) by id and the test set checked against `model` at the parameters `theta` and against
    `likelihood` (the rules of this module, which the guide states as "What your data must look like"), with labels
    and integer features cast as those rules say.
    Raises `DataError` naming the first client (or the test set) that breaks a rule."""
    named = {f"client {k}": pair for k, pair in clients.items()}
    if test is not None:
        named[TEST] = test
    named = {who: (X, _targets(who, X, y, likelihood)) for who, (X, y) in named.items()}
    _same_shapes({who: pair for who, pair in named.items() if who != TEST})
    named = _cast_integer_features(model, theta, named)
    for who, (X, y) in named.items():
        _finite(who, "features", X)
        if isinstance(likelihood, (Classification, GaussianRegression)):
            _finite(who, "targets", y)
    outputs = _outputs(model, theta, {who: X for who, (X, _) in named.items()}, _like_the_clients(named))
    heads = {who: y[:PER_CLIENT].to(theta.device) for who, (_, y) in named.items()}
    if isinstance(likelihood, Classification):
        _labels_in_range({who: y for who, (_, y) in named.items()}, outputs)
    if isinstance(likelihood, GaussianRegression):
        for who, y in heads.items():
            _outputs_match_targets(who, outputs[who], y)
    _loss_is_finite(likelihood, outputs, heads)
    parts = {k: named[f"client {k}"] for k in clients}
    return parts, named[TEST] if test is not None else None


def check_inputs(model: FlatModel, theta: Tensor, X: Any, like: Tensor, who: str = "the OOD set") -> Tensor:
    """Inputs without targets (`who`, e.g. the out-of-distribution set) checked as the test set's features are:
    a tensor (or array-like) with the rows of `like` (the test inputs), integer features cast to `like`'s floating
    dtype, finite, and taken by `model` at `theta`. Returns them as a tensor; a `DataError` naming `who` otherwise."""
    tensor = _tensor(X)
    if tensor is None or tensor.dim() == 0 or tensor.shape[0] == 0:
        got = tuple(tensor.shape) if tensor is not None else type(X).__name__
        raise DataError(f"{who} must be a tensor or array of N ≥ 1 inputs, got {got}")
    if tensor.shape[1:] != like.shape[1:]:
        raise DataError(
            f"{who} has inputs of shape {tuple(tensor.shape[1:])}, the test set {tuple(like.shape[1:])}; "
            "give it inputs of the test set's shape (preprocessed as the test set is)"
        )
    if like.is_floating_point() and not tensor.is_floating_point():
        tensor = tensor.to(like.dtype)
    _finite(who, "features", tensor)
    _forward_one(model, theta, who, tensor[:PER_CLIENT].to(theta.device), "give it inputs of the test set's dtype")
    return tensor


def check_client_objects(theta: Tensor, clients: Mapping[int, Any]) -> None:
    """Ready `ClientData` objects: each has examples, and its `batch_loss` of its first examples at `theta` (on the
    run's device) runs and is a finite scalar. What the loss is made of is the object's own, so that is all."""
    for k, data in clients.items():
        who = f"client {k}"
        n = data.num_examples
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise DataError(f"{who}: num_examples is {n!r}; a client needs a positive int number of examples")
        idx = torch.arange(min(n, PER_CLIENT), device=theta.device)
        loss_of = functools.partial(data.batch_loss, theta, idx)
        _scalar_loss(who, "batch_loss(theta, idx) of its first examples", loss_of, "check its ClientData object")


def _targets(who: str, X: Tensor, y: Tensor, likelihood: Likelihood) -> Tensor:
    """y checked against X (one row per example) and the likelihood; `Classification`'s labels made int64."""
    if X.dim() == 0 or y.dim() == 0:
        raise DataError(f"{who}: X and y need one row per example, got shapes {tuple(X.shape)} and {tuple(y.shape)}")
    if X.shape[0] != y.shape[0]:
        raise DataError(f"{who}: X has {X.shape[0]} examples but y has {y.shape[0]}; give one target per example")
    if X.shape[0] == 0:
        raise DataError(f"{who} has no examples; give it at least one, or leave it out")
    if X.is_complex():
        raise DataError(f"{who}: its features are {X.dtype}; the model takes real numbers (floats or integers)")
    if isinstance(likelihood, Classification):
        if y.dim() != 1:
            if y.dim() == 2 and y.shape[1] > 1:
                fix = "pass y.argmax(1) (one-hot and probability rows are not supported)"
            elif y.shape[1:].numel() == 1:
                fix = "pass y.reshape(-1)"
            else:
                fix = "give one class index per example"
            raise DataError(
                f"{who}: labels have shape {tuple(y.shape)}, but Classification takes class indices of shape (N,); "
                + fix
            )
        if y.is_floating_point() or y.is_complex():
            raise DataError(
                f"{who}: labels are {str(y.dtype).removeprefix('torch.')}, but Classification takes integer class "
                "indices; pass integer labels (y.astype(int) for a numpy array, y.long() for a tensor)"
            )
        return y.long()  # any integer dtype: F.cross_entropy and nll_grad's scatter index with int64
    if isinstance(likelihood, GaussianRegression) and (y.is_complex() or y.dtype == torch.bool):
        raise DataError(
            f"{who}: targets are {y.dtype}; GaussianRegression takes real targets, pass "
            "y.astype(float) for a numpy array, y.float() for a tensor"
        )
    return y


def _same_shapes(named: Mapping[str, Pair]) -> None:
    """Every client's examples have the first one's shape (they are rows of one tensor, `TensorClients`)."""
    if not named:
        return
    first, (X0, y0) = next(iter(named.items()))
    for who, (X, y) in named.items():
        if X.shape[1:] != X0.shape[1:] or y.shape[1:] != y0.shape[1:]:
            raise DataError(
                f"{who}'s examples have features {tuple(X.shape[1:])} and targets {tuple(y.shape[1:])}, {first}'s "
                f"{tuple(X0.shape[1:])} and {tuple(y0.shape[1:])}; give every client examples of one shape"
            )


def _cast_integer_features(model: FlatModel, theta: Tensor, named: dict[str, Pair]) -> dict[str, Pair]:
    """Integer (and bool) features cast to θ's dtype, unless the model takes the first such client's as they are
    (an `nn.Embedding` takes token ids; a linear or convolutional layer refuses integers)."""
    integer = [who for who, (X, _) in named.items() if not X.is_floating_point()]
    if not integer:
        return named
    try:
        with torch.no_grad():
            model.forward(theta, named[integer[0]][0][:PER_CLIENT].to(theta.device))
        return named
    except Exception:  # whatever the model raises on integers, floats are the other reading
        return {who: (X if X.is_floating_point() else X.to(theta.dtype), y) for who, (X, y) in named.items()}


def _finite(who: str, what: str, t: Tensor) -> None:
    """No NaN or infinity in t: a data error here, not a divergence in round 1."""
    if all_finite(t):
        return
    bad = ~torch.isfinite(t)
    row = int(bad.reshape(t.shape[0], -1).any(dim=1).nonzero()[0, 0])
    raise DataError(
        f"{who}: {int(bad.sum())} of its {what} are NaN or infinite (the first in example {row}); "
        "drop or impute those examples before the run"
    )


def _like_the_clients(named: Mapping[str, Pair]) -> str:
    """The fix for a test set the model does not take: the clients' feature shape, where there are clients."""
    shapes = [tuple(X.shape[1:]) for who, (X, _) in named.items() if who != TEST]
    return f"give it features of the clients' shape {shapes[0]}" if shapes else ""


def _outputs(model: FlatModel, theta: Tensor, features: Mapping[str, Tensor], test_fix: str = "") -> dict[str, Tensor]:
    """The model's outputs on each one's first `PER_CLIENT` examples, one batched pass per feature shape; a pass
    that fails is repeated one by one so that the error names its client."""
    groups: dict[tuple, list[str]] = {}
    for who, X in features.items():
        groups.setdefault((X.shape[1:], X.dtype), []).append(who)
    outputs: dict[str, Tensor] = {}
    for names in groups.values():
        heads = [features[who][:PER_CLIENT].to(theta.device) for who in names]
        try:
            with torch.no_grad():
                rows = torch.cat([model.forward(theta, chunk) for chunk in torch.cat(heads).split(CHUNK)])
            if rows.dim() == 0 or rows.shape[0] != sum(len(h) for h in heads):
                raise ValueError("not one output per example")
        except Exception:  # found again below, client by client, with the client's name
            for who, head in zip(names, heads, strict=True):
                outputs[who] = _forward_one(model, theta, who, head, test_fix if who == TEST else "")
            raise  # the batch fails where no single client does: the model depends on the batch; say so as it is
        outputs.update(zip(names, rows.split([len(h) for h in heads]), strict=True))
    return outputs


def _forward_one(model: FlatModel, theta: Tensor, who: str, head: Tensor, fix: str = "") -> Tensor:
    """The model's outputs on `head`, or a `DataError` naming `who` (with `fix`, or the general one)."""
    shape = tuple(head.shape[1:])
    fix = fix or "give features of the shape and dtype the model's first layer takes"
    try:
        with torch.no_grad():
            out = model.forward(theta, head)
    except Exception as exc:  # any failure of the user's model on these inputs is the data's error
        raise DataError(
            f"{who}: the model does not take its features of shape {shape} ({_first_line(exc)}); {fix}"
        ) from None
    if not isinstance(out, Tensor) or out.dim() == 0 or out.shape[0] != head.shape[0]:
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise DataError(f"{who}: the model must return one output row per example, got {got} for {len(head)}")
    if not all_finite(out):
        raise DataError(
            f"{who}: the model's outputs on its first examples are NaN or infinite at the initial parameters; "
            "scale its features (standardise them) or check the model's initialisation"
        )
    return out


def _labels_in_range(labels: Mapping[str, Tensor], outputs: Mapping[str, Tensor]) -> None:
    """Class indices in 0..C−1 for logits (N, C); the fix for a model with too few outputs counts every label."""
    bounds = {who: [int(v) for v in torch.aminmax(y)] for who, y in labels.items()}
    for who, (low, high) in bounds.items():
        if outputs[who].dim() != 2:
            raise DataError(
                f"{who}: the model's outputs have shape {tuple(outputs[who].shape)}, but Classification takes logits "
                "of shape (N, C), one per class; end the model with a layer of C outputs"
            )
        last = outputs[who].shape[1] - 1
        if low < 0:
            raise DataError(f"{who}: label {low} is negative; map the labels to the class indices 0..{last}")
        if high > last:
            top = max(h for _, h in bounds.values())
            raise DataError(
                f"{who}: label {high} is out of range for the model's {last + 1} outputs (one per class, labels "
                f"0..{last}); give the model {top + 1} outputs (the largest label is {top}), or map them to 0..{last}"
            )


def _outputs_match_targets(who: str, outputs: Tensor, y: Tensor) -> None:
    """`GaussianRegression`: an output per target dimension (a trailing 1 squeezed for targets (N,))."""
    if outputs.dim() == y.dim() + 1 and outputs.shape[-1] == 1:
        outputs = outputs.squeeze(-1)
    if outputs.shape[1:] != y.shape[1:]:
        want = tuple(y.shape[1:]) or (1,)
        raise DataError(
            f"{who}: targets have shape {tuple(y.shape[1:])} per example but the model's outputs "
            f"{tuple(outputs.shape[1:])}; give the model outputs of shape {want}"
        )


def _loss_is_finite(likelihood: Likelihood, outputs: Mapping[str, Tensor], targets: Mapping[str, Tensor]) -> None:
    """The likelihood's loss of the first examples, all in one call where their shapes allow; client by client
    where that call fails or is not finite, to name the client."""
    try:
        with torch.no_grad():
            loss = likelihood.mean_nll(torch.cat(list(outputs.values())), torch.cat(list(targets.values())))
        if isinstance(loss, Tensor) and loss.numel() == 1 and all_finite(loss):
            return
    except Exception:  # found again below, client by client, with the client's name
        pass
    name = type(likelihood).__name__
    fix = f"give targets {name} takes" + (" (check fn)" if isinstance(likelihood, NegLogLikelihood) else "")
    for who in outputs:
        loss_of = functools.partial(likelihood.mean_nll, outputs[who], targets[who])
        _scalar_loss(who, f"{name}'s loss on its first examples", loss_of, fix)


def _scalar_loss(who: str, what: str, loss_of: Callable[[], Any], fix: str) -> None:
    """`loss_of()` runs and is a finite scalar, or a `DataError` saying `who`, `what` and the `fix`."""
    try:
        with torch.no_grad():
            loss = loss_of()
    except Exception as exc:  # any failure on this client's data is reported with its name
        raise DataError(f"{who}: {what} fails ({_first_line(exc)}); {fix}") from None
    if not isinstance(loss, Tensor) or loss.numel() != 1:
        got = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
        raise DataError(f"{who}: {what} must be a scalar tensor, got {got}; {fix}")
    if not all_finite(loss.detach()):
        raise DataError(f"{who}: {what} is {loss.item()} at the initial parameters; {fix}")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."
