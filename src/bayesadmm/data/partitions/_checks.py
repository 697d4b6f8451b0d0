"""Argument checks shared by the splits."""

from __future__ import annotations

import math

import torch

_F64 = torch.float64


def _check_labels(labels) -> torch.Tensor:
    labels = torch.as_tensor(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {tuple(labels.shape)}")
    if labels.dtype == torch.bool or labels.dtype.is_floating_point or labels.dtype.is_complex:
        raise ValueError(f"labels must have an integer dtype, got {labels.dtype}")
    return labels.to(device="cpu", dtype=torch.int64)


def _check_generator(generator) -> torch.Generator:
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            "generator must be a torch.Generator (e.g. torch.Generator().manual_seed(0)); "
            f"got {type(generator).__name__}. Splits never use the global RNG."
        )
    if generator.device.type != "cpu":
        raise ValueError(f"generator must be a CPU generator (all draws are on the CPU), got one on {generator.device}")
    return generator


def _check_positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _check_concentration(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def _check_enough_examples(n: int, num_clients: int) -> None:
    if n < num_clients:
        raise ValueError(f"cannot give {num_clients} clients at least one example each from {n} examples")


def _check_split(labels, num_clients, generator) -> tuple[torch.Tensor, int, torch.Generator]:
    """The checks every split starts with: labels, number of clients, generator (in that order)."""
    return _check_labels(labels), _check_positive_int(num_clients, "num_clients"), _check_generator(generator)
