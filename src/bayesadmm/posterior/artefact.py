"""`bayesadmm.Posterior`: a trained posterior over a model's flat parameter vector, with the model's parameter layout.

    q = result.posterior                       # or bayesadmm.Posterior.load("posterior.safetensors")
    q.save("posterior.safetensors")            # one safetensors file, checksummed (`posterior.file`)
    net = q.to_module(my_module)               # a copy of the module at the posterior mean
    probs = q.predict(my_module, x, samples=32)  # the posterior predictive, (N, C) for classification

Two kinds, both `Posterior`s: `GaussianPosterior` (a `families.Posterior` with a layout: `.family`, `.natural`,
`.mean`, `.precision`, `.sample(n, generator)`, `.log_prob`) and `PointPosterior` (a `PointEstimate` with a layout:
`.mean` only, so `evaluation.metrics.evaluate`, which takes the predictive of whatever has `.sample`, scores it at
its mean). The layout is ``((name, shape), ...)`` in ``named_parameters()`` order, as `FlatModel.layout` gives it.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from bayesadmm import families
from bayesadmm.algorithms.base import PointEstimate
from bayesadmm.engine.rundir import POSTERIOR, read_bytes, write_bytes
from bayesadmm.evaluation.metrics import _in_batches
from bayesadmm.likelihoods import Classification, Likelihood
from bayesadmm.models import FlatModel
from bayesadmm.posterior.file import DTYPES, FAMILIES, Layout, PosteriorFileError, decode, encode

if TYPE_CHECKING:  # a Result holds its posterior: engine.federation imports this module
    from bayesadmm.engine.federation import Result

__all__ = ["Posterior", "GaussianPosterior", "PointPosterior", "PosteriorFileError", "layout_of", "save_posterior"]


def layout_of(model: FlatModel | nn.Module) -> Layout:
    """``((name, shape), ...)`` of a model's parameters in ``named_parameters()`` order."""
    if isinstance(model, FlatModel):
        return model.layout
    if isinstance(model, nn.Module):
        return tuple((name, tuple(p.shape)) for name, p in model.named_parameters())
    raise TypeError(f"model must be a torch.nn.Module or a bayesadmm.FlatModel, got {type(model).__name__}")


def layout_mismatch(mine: Layout, theirs: Layout) -> str:
    """The first difference between two layouts, in words."""
    for k in range(max(len(mine), len(theirs))):
        a = mine[k] if k < len(mine) else None
        b = theirs[k] if k < len(theirs) else None
        if a != b:
            return f"parameter {k}: the posterior has {a}, the model {b}"
    return "none"


def _checked_layout(layout: Any, dim: int) -> Layout:
    """`layout` as a tuple of (name, shape) tuples whose sizes add up to `dim`; a ValueError otherwise."""
    checked = tuple((str(name), tuple(int(n) for n in shape)) for name, shape in layout)
    total = sum(math.prod(shape) for _, shape in checked)
    if total != dim:
        raise ValueError(
            f"the layout's parameters add up to {total} numbers, the posterior has {dim}: give the model it belongs to"
        )
    return checked


class Posterior:
    """A trained posterior over a model's flat parameters together with the model's layout (abstract: see
    `GaussianPosterior`, `PointPosterior`, and `Posterior.of` to make one). `provenance` says where it came from
    (method, round, run; for a scenario's run, the scenario's model and data), as plain JSON-able values."""

    mean: Tensor
    layout: Layout
    provenance: Mapping[str, Any]

    @staticmethod
    def of(distribution: Any, model: FlatModel | nn.Module | Layout, provenance: Mapping | None = None) -> Posterior:
        """The product of an algorithm's posterior (a `families.Posterior` or a `PointEstimate`) and the layout of
        `model` (or a layout itself); a TypeError for anything else."""
        layout = model if isinstance(model, tuple) else layout_of(model)
        provenance = dict(provenance or {})
        if isinstance(distribution, families.Posterior):
            return GaussianPosterior(distribution.family, distribution.natural, layout, provenance)
        if isinstance(distribution, PointEstimate):
            return PointPosterior(distribution.mean, layout, provenance)
        raise TypeError(
            f"cannot make a bayesadmm.Posterior of {type(distribution).__name__}: give a families.Posterior "
            "(a Gaussian) or a PointEstimate"
        )

    @property
    def family_name(self) -> str:
        """``isotropic``, ``diagonal``, ``full`` or ``point``."""
        raise NotImplementedError

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])

    # ---- the file ------------------------------------------------------------------------------------------------

    def _stored(self) -> tuple[dict[str, Any], dict[str, Tensor]]:
        """The family's own header fields and tensors (`posterior.file.FAMILIES`)."""
        raise NotImplementedError

    def save(self, path: str | Path) -> Path:
        """Write the posterior to `path` (a `.safetensors` file, `posterior.file`): whole or not at all (a temporary
        name, fsync, rename). Returns the path."""
        dtype = {v: k for k, v in DTYPES.items()}.get(self.mean.dtype)
        if dtype is None:
            raise ValueError(f"a posterior file holds float32 or float64 numbers, this posterior is {self.mean.dtype}")
        extra, tensors = self._stored()
        header = {
            "family": self.family_name,
            "tensors": list(FAMILIES[self.family_name]),
            "dim": self.dim,
            "dtype": dtype,
            "layout": [[name, list(shape)] for name, shape in self.layout],
            "provenance": dict(self.provenance),
            **extra,
        }
        path = Path(path)
        write_bytes(path, encode(header, tensors))
        return path

    @staticmethod
    def load(path: str | Path) -> Posterior:
        """The posterior `save` wrote to `path`, every field checked (format, version, checksum, shapes against the
        family and the layout, finite values, a valid Gaussian): a `PosteriorFileError` (a ValueError) otherwise.
        Nothing in the file is executed; it is read without following a symbolic link."""
        where = str(path)
        header, tensors = decode(read_bytes(Path(path)), where)
        dim = int(header["dim"])
        layout = tuple((name, tuple(shape)) for name, shape in header["layout"])
        provenance = header.get("provenance") or {}
        if not isinstance(provenance, dict):
            raise PosteriorFileError(f"{where}: its provenance is not a table; save it again with Posterior.save")
        try:
            if header["family"] == "point":
                return PointPosterior(tensors["mean"], layout, provenance)
            options = {"precision": float(header["precision"])} if header["family"] == "isotropic" else {}
            family = families.make_family(header["family"], dim, **options)
            natural = tuple(tensors[name] for name in FAMILIES[header["family"]])
            return GaussianPosterior(family, natural, layout, provenance)
        except ValueError as exc:
            raise PosteriorFileError(
                f"{where} holds no valid {header['family']} posterior ({exc}); save a valid one with Posterior.save"
            ) from None

    # ---- using it --------------------------------------------------------------------------------------------------

    def _check_model(self, found: Layout, what: str) -> None:
        if found != self.layout:
            raise ValueError(
                f"{what} does not fit this posterior ({layout_mismatch(self.layout, found)}); "
                "pass a module of the architecture the posterior was trained with"
            )

    def to_module(self, model: nn.Module) -> nn.Module:
        """A copy of `model` with its parameters set to the posterior mean, in the posterior's dtype and in eval mode
        (as the federation evaluated it: BatchNorm with its carried statistics, no Dropout); `model` is unchanged.
        Its parameter names and shapes must be the posterior's layout."""
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self._check_model(layout_of(model), "the model")
        module = copy.deepcopy(model).to(dtype=self.mean.dtype)
        parameters = dict(module.named_parameters())
        chunks = self.mean.detach().split([math.prod(shape) for _, shape in self.layout])
        with torch.no_grad():
            for (name, shape), chunk in zip(self.layout, chunks, strict=True):
                parameters[name].copy_(chunk.view(shape))
        return module.eval()

    def predict(
        self,
        model: nn.Module | FlatModel,
        x: Any,
        samples: int = 32,
        generator: torch.Generator | None = None,
        likelihood: Likelihood | None = None,
        batch_size: int = 2048,
    ) -> Tensor:
        """The posterior predictive of inputs `x (N, ...)` (a tensor, or what `torch.as_tensor` takes: a numpy array,
        nested lists of numbers): ``likelihood.predictive`` of the model's outputs under `samples` draws from the
        posterior (made once with `generator`, shared by all batches), as `evaluation.metrics.evaluate` computes it.
        For `Classification()` (the default) the mean of the class probabilities over the draws, shape (N, C). A point
        estimate, or ``samples=0``, predicts at the mean. Computed on the posterior's device (`x` is moved there) in
        its dtype (floating-point inputs are cast to it; integer inputs too where the model does not take them as they
        are). Inputs the model does not take are a ValueError naming their shape."""
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
            raise ValueError(f"samples must be a non-negative integer, got {samples!r}")
        flat = model if isinstance(model, FlatModel) else FlatModel.from_module(model)
        self._check_model(flat.layout, "the model")
        likelihood = likelihood or Classification()

        with torch.inference_mode():
            mean = self.mean
            x = self._inputs(flat, x)
            sample = getattr(self, "sample", None)
            if samples == 0 or sample is None:
                summary, _ = _in_batches(lambda xb: flat.forward(mean, xb)[None], likelihood, x, batch_size, False)
            else:
                thetas = sample(samples, generator)
                summary, _ = _in_batches(lambda xb: flat.forward_batched(thetas, xb), likelihood, x, batch_size, False)
        return summary

    def _inputs(self, flat: FlatModel, x: Any) -> Tensor:
        """`x` as a tensor on the posterior's device that the model takes: floating point in the posterior's dtype,
        integers as they are where the model takes them (token ids), else cast as floats are (`userdata`'s rule);
        tried on the first example so that a wrong shape is a ValueError rather than torch's error mid-batch."""
        mean = self.mean
        try:
            tensor = x if isinstance(x, Tensor) else torch.as_tensor(x)
        except (RuntimeError, TypeError, ValueError):
            tensor = None
        if tensor is None or tensor.dim() == 0 or tensor.shape[0] == 0:
            got = tuple(tensor.shape) if tensor is not None else type(x).__name__
            raise ValueError(f"x must be a tensor or array of N >= 1 inputs, got {got}")
        tensor = tensor.to(mean.device)
        if tensor.is_floating_point():
            tensor = tensor.to(mean.dtype)
        try:
            flat.forward(mean, tensor[:1])
            return tensor
        except Exception as exc:  # noqa: BLE001 — whatever the model raises on these inputs
            if not tensor.is_floating_point() and not tensor.is_complex():
                return self._inputs(flat, tensor.to(mean.dtype))
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(
            f"the model does not take inputs of shape {tuple(tensor.shape[1:])} ({reason}); "
            f"give inputs of the shape it was trained on{_first_layer(flat)}"
        )


def _first_layer(flat: FlatModel) -> str:
    """What the model's first layer takes, where it is a linear layer (the common case of tabular inputs)."""
    owner = flat.layout[0][0].rpartition(".")[0]
    layer = flat.module.get_submodule(owner)
    if not isinstance(layer, nn.Linear):
        return ""
    return f" (its first layer{f' {owner!r}' if owner else ''} takes {layer.in_features} features per example)"


@dataclass(frozen=True, eq=False)
class GaussianPosterior(Posterior, families.Posterior):
    """A Gaussian posterior (isotropic, diagonal or full; `families.Posterior`) with the model's layout."""

    layout: Layout = ()
    provenance: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()  # the family validates the natural parameter
        object.__setattr__(self, "layout", _checked_layout(self.layout, self.family.dim))

    @property
    def family_name(self) -> str:
        return self.family.name

    def _stored(self) -> tuple[dict[str, Any], dict[str, Tensor]]:
        extra = {"precision": self.family.precision} if isinstance(self.family, families.IsotropicGaussian) else {}
        return extra, dict(zip(FAMILIES[self.family_name], self.natural, strict=True))


@dataclass(frozen=True, eq=False)
class PointPosterior(Posterior, PointEstimate):
    """A point estimate (FedAvg, ADMM, ...; `PointEstimate`) with the model's layout: `.mean` and no `.sample`."""

    layout: Layout = ()
    provenance: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.mean, Tensor) or self.mean.dim() != 1 or not self.mean.is_floating_point():
            raise ValueError("a point estimate's mean must be a floating-point vector")
        if not bool(torch.isfinite(self.mean).all()):
            raise ValueError("a point estimate's mean must be finite")
        object.__setattr__(self, "layout", _checked_layout(self.layout, int(self.mean.shape[0])))

    @property
    def family_name(self) -> str:
        return "point"

    def _stored(self) -> tuple[dict[str, Any], dict[str, Tensor]]:
        return {}, {"mean": self.mean}


def save_posterior(result: Result) -> None:
    """posterior.safetensors: the run's posterior (the last good state), so that the run directory can be handed to
    someone who only predicts. A user's algorithm whose posterior is not a Gaussian or a point estimate has none."""
    try:
        posterior = result.posterior
    except ValueError as exc:  # a user's algorithm whose posterior is not over the model's parameters
        warnings.warn(f"the run wrote no {POSTERIOR}: {exc}", stacklevel=2)
        return
    if isinstance(posterior, Posterior):
        posterior.save(result.run_dir / POSTERIOR)
