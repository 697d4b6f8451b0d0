"""A SuperNode's own data: the loaders a node config names, and the tensor files they read.

A node's ``--node-config`` says where its examples are, one of:

* ``data=PATH``: a file of tensors X and y, ``.npz`` (numpy arrays named X and y) or ``.pt`` (a dict with X and y,
  read with ``torch.load(weights_only=True)``, so never unpickled code); `save_tensors` writes either;
* ``loader=module:function``: your function, called with the node config (a dict), returning (X, y), a Dataset of
  (x, y) pairs, or a ready `bayesadmm.ClientData`.

The node reads nothing else: no other client's examples, no evaluation set. A preset run's node without either
takes its slice of the preset (`preset_slice`), which builds the whole preset: for simulations and tests only.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from bayesadmm.clients import ClientData, SupervisedData
from bayesadmm.experiments.build import build
from bayesadmm.experiments.config import RunConfig
from bayesadmm.likelihoods import Likelihood
from bayesadmm.models import FlatModel
from bayesadmm.userdata import as_tensors, check_data

DATA, LOADER = "data", "loader"


def entry_point(spec: str, what: str) -> Callable[..., Any]:
    """The function ``module:function`` names (the module imported as Python imports it)."""
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"{what}={spec!r} is not an entry point; write it as module:function (e.g. mymodel:build)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"{what}={spec}: cannot import {module_name} ({exc}); is it installed or on PYTHONPATH?"
        ) from None
    target: Any = module
    for part in name.split("."):
        if not hasattr(target, part):
            raise ValueError(f"{what}={spec}: {module_name} has no {name}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{what}={spec}: {name} is not callable")
    return target


def load_tensors(path: str | Path) -> tuple[Tensor, Tensor]:
    """(X, y) from a .npz file (arrays X and y) or a .pt file (a dict with tensors X and y), without pickle."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no data file at {path}; write one with bayesadmm.flower.loaders.save_tensors")
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as arrays:
            if not {"X", "y"} <= set(arrays.files):
                raise ValueError(f"{path} holds {sorted(arrays.files)}; it needs arrays named X and y")
            return torch.from_numpy(arrays["X"].copy()), torch.from_numpy(arrays["y"].copy())
    if path.suffix == ".pt":
        loaded = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(loaded, Mapping) or not {"X", "y"} <= set(loaded):
            raise ValueError(f"{path} must hold a dict with tensors X and y")
        return loaded["X"], loaded["y"]
    raise ValueError(f"{path}: data files are .npz or .pt")


def save_tensors(path: str | Path, X: Tensor, y: Tensor) -> Path:
    """Write (X, y) as `load_tensors` reads them (.npz or .pt, by the suffix)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".npz":
        np.savez(path, X=X.detach().cpu().numpy(), y=y.detach().cpu().numpy())
    elif path.suffix == ".pt":
        torch.save({"X": X.detach().cpu(), "y": y.detach().cpu()}, path)
    else:
        raise ValueError(f"{path}: data files are .npz or .pt")
    return path


def node_data(
    node_config: Mapping[str, Any],
    model: FlatModel,
    likelihood: Likelihood,
    device: str,
    client: int = 0,
    dtype: torch.dtype | None = None,
) -> ClientData | None:
    """The node's own client data, from its node config's ``loader`` or ``data``; None if it names neither. (X, y)
    are checked against the model and the likelihood as `bayesadmm.run` checks a client's (`userdata.check_data`,
    naming the node's `client` id), at the parameters of a freshly built model in `dtype` (the run's precision): the
    check only needs their shape."""
    if node_config.get(LOADER):
        loaded = entry_point(str(node_config[LOADER]), LOADER)(dict(node_config))
        if isinstance(loaded, ClientData) and not isinstance(loaded, (tuple, list)):
            return loaded
        X, y = as_tensors(loaded, f"the data of loader {node_config[LOADER]}")
    elif node_config.get(DATA):
        X, y = load_tensors(str(node_config[DATA]))
    else:
        return None
    theta = model.initial_params(torch.Generator())
    theta = theta if dtype is None else theta.to(dtype)  # the run's precision: integer features are cast to it
    parts, _ = check_data(model, theta, likelihood, {client: (X, y)})
    X, y = parts[client]
    return SupervisedData(model, X.to(device), y.to(device), likelihood)


def preset_slice(preset: Mapping[str, Any], client: int, data_dir: str = "") -> ClientData:
    """Client `client`'s data in a preset run, from the preset's own deterministic build (which reads every
    client's examples: simulations and tests only; a deployment gives each node its file)."""
    config = RunConfig(**{**preset, **({"data_dir": data_dir} if data_dir else {})})
    return build(config).federation.clients(client)
