"""The architectures of the experiments, each a factory returning a :class:`FlatModel`.

Every factory passes the FlatModel a ``functools.partial`` of a module-level builder rather than a lambda, so models
stay picklable (worker processes receive them).  A new architecture is one builder, one factory and one entry in
:data:`MODELS`; inputs are images ``(N, ...)`` and outputs logits ``(N, num_classes)``.
"""

from __future__ import annotations

from functools import partial

from torch import nn

from .functional import FlatModel

__all__ = ["MODELS", "make_model", "mlp", "logistic"]

_ACTIVATIONS: dict[str, type[nn.Module]] = {"sigmoid": nn.Sigmoid, "relu": nn.ReLU, "tanh": nn.Tanh}


def _build_mlp(in_features: int, hidden: tuple[int, ...], num_classes: int, activation: str) -> nn.Module:
    widths = (in_features, *hidden)
    layers: list[nn.Module] = [nn.Flatten()]
    for fan_in, fan_out in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(fan_in, fan_out), _ACTIVATIONS[activation]()]
    layers.append(nn.Linear(widths[-1], num_classes))
    return nn.Sequential(*layers)


def mlp(
    in_features: int = 784,
    hidden: tuple[int, ...] = (200, 100),
    num_classes: int = 10,
    activation: str = "sigmoid",
) -> FlatModel:
    """Fully connected network ``in_features → hidden… → num_classes`` on flattened inputs.

    The defaults are the papers' MLP 784-200-100-10 with sigmoid activations (178 110 parameters).
    """
    if activation not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; valid: {', '.join(sorted(_ACTIVATIONS))}")
    return FlatModel(partial(_build_mlp, in_features, tuple(hidden), num_classes, activation))


def _build_logistic(in_features: int, num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, num_classes))


def logistic(in_features: int = 784, num_classes: int = 10) -> FlatModel:
    """Multiclass logistic (softmax) regression: logits ``W x + b`` on flattened inputs."""
    return FlatModel(partial(_build_logistic, in_features, num_classes))


MODELS = {"mlp": mlp, "logistic": logistic}


def make_model(name: str, **kw) -> FlatModel:
    """Model by name; ``kw`` go to its factory."""
    try:
        factory = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; valid: {', '.join(sorted(MODELS))}") from None
    return factory(**kw)
