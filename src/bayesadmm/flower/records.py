"""Lossless conversion between bayesadmm's values and Flower's records.

Three conversions, none of which knows anything about an algorithm:

* a `Message` (flat ``dict[str, Tensor]``) <-> an `ArrayRecord`, key for key, dtype and shape kept;
* a client state (a pytree: NamedTuples, tuples, lists, dicts, tensors, None, bools, ints, floats, strings) <->
  an `ArrayRecord` of its tensors plus a `ConfigRecord` holding the tree's structure as JSON, so a SuperNode can
  keep an algorithm's per-client state (duals, local posteriors) in its `Context.state` between rounds without
  pickling arbitrary objects;
* a `RunConfig` <-> a JSON string inside a `ConfigRecord`.

NamedTuple types are stored by ``module:qualname`` and are only re-imported from the ``bayesadmm`` package, so
reading a state never imports or runs code from anywhere else.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from torch import Tensor

from bayesadmm.experiments.config import RunConfig

STATE_ARRAYS = "bayesadmm.client-state"
STATE_TREE = "bayesadmm.client-state.tree"
TRUSTED_PACKAGE = "bayesadmm"


class RecordError(ValueError):
    """A value cannot be turned into a record, or a record is not one this module wrote."""


# --- reading records -----------------------------------------------------------------------------------------------
# A RecordDict may hold any kind of record under any key, and a record any of its value types: what the peer wrote is
# checked here, so that a message from something other than bayesadmm fails with a clear error.

_Record = TypeVar("_Record", ArrayRecord, ConfigRecord, MetricRecord)


def get_record(content: RecordDict, key: str, kind: type[_Record]) -> _Record:
    """content[key], which must be a `kind` record."""
    value = content[key]
    if not isinstance(value, kind):
        raise RecordError(f"record {key!r} is a {type(value).__name__}, expected a {kind.__name__}")
    return value


def int_entry(record: ConfigRecord | MetricRecord, key: str) -> int:
    """record[key], which must be an int."""
    value = record[key]
    if not isinstance(value, int):
        raise RecordError(f"entry {key!r} is a {type(value).__name__}, expected an int")
    return value


def str_entry(record: ConfigRecord, key: str) -> str:
    """record[key], which must be a str."""
    value = record[key]
    if not isinstance(value, str):
        raise RecordError(f"entry {key!r} is a {type(value).__name__}, expected a str")
    return value


def number(value: object, key: str) -> int | float:
    """A record's entry `value` (under `key`), which must be an int or a float."""
    if not isinstance(value, (int, float)):
        raise RecordError(f"entry {key!r} is a {type(value).__name__}, expected a number")
    return value


# --- messages ------------------------------------------------------------------------------------------------------


def message_to_record(message: Mapping[str, Tensor]) -> ArrayRecord:
    """A Message as an ArrayRecord, one Array per key (the algorithms' message keys are kept verbatim)."""
    arrays = {}
    for key, value in message.items():
        if not isinstance(key, str) or not isinstance(value, Tensor):
            raise RecordError(f"a Message maps str to Tensor; key {key!r} holds {type(value).__name__}")
        arrays[key] = _array(value, key)
    return ArrayRecord(arrays)


def record_to_message(record: ArrayRecord, device: torch.device | str | None = None) -> dict[str, Tensor]:
    """The Message an ArrayRecord was made from (same keys, dtypes, shapes and values), its tensors on `device`
    (None: the CPU). Records hold numpy arrays, so the receiver must say where its computation runs."""
    return {key: _tensor(array, key, device) for key, array in record.items()}


def _array(tensor: Tensor, where: str) -> Array:
    if tensor.dtype in (torch.bfloat16, torch.complex32) or tensor.is_sparse:
        raise RecordError(f"{where}: {tensor.dtype} tensors have no lossless numpy form")
    return Array(tensor.detach().cpu().contiguous().numpy())


def _tensor(array: Array, where: str, device: torch.device | str | None = None) -> Tensor:
    try:
        ndarray = array.numpy()
    except TypeError as exc:
        raise RecordError(f"{where}: {exc}") from None
    tensor = torch.from_numpy(np.array(ndarray, copy=True))  # writable and owned, never a view of the record
    return tensor if device is None else tensor.to(device)


# --- client states (pytrees) ----------------------------------------------------------------------------------------


def tree_to_records(tree: Any) -> tuple[ArrayRecord, ConfigRecord]:
    """Flatten `tree` into its tensors (keys "0", "1", ... in traversal order) and a JSON description of the rest."""
    arrays: dict[str, Array] = {}

    def encode(node, path: str):
        if isinstance(node, Tensor):
            arrays[str(len(arrays))] = _array(node, path)
            return {"tensor": len(arrays) - 1}
        if node is None:
            return {"none": True}
        if isinstance(node, bool):
            return {"bool": node}
        if isinstance(node, int):
            return {"int": node}
        if isinstance(node, float):
            return {"float": node.hex()}  # exact, and JSON has no nan or inf
        if isinstance(node, str):
            return {"str": node}
        if isinstance(node, tuple) and hasattr(node, "_fields"):
            kind = type(node)
            if not kind.__module__.split(".")[0] == TRUSTED_PACKAGE:
                raise RecordError(f"{path}: NamedTuple {kind.__module__}.{kind.__qualname__} is not a bayesadmm type")
            return {
                "namedtuple": f"{kind.__module__}:{kind.__qualname__}",
                "items": [encode(v, f"{path}.{f}") for f, v in zip(node._fields, node, strict=True)],
            }
        if isinstance(node, tuple):
            return {"tuple": [encode(v, f"{path}[{i}]") for i, v in enumerate(node)]}
        if isinstance(node, list):
            return {"list": [encode(v, f"{path}[{i}]") for i, v in enumerate(node)]}
        if isinstance(node, dict):
            items = []
            for key, value in node.items():
                if isinstance(key, bool) or not isinstance(key, (int, str)):
                    raise RecordError(f"{path}: dict keys must be int or str, got {key!r}")
                items.append([encode(key, path), encode(value, f"{path}[{key!r}]")])
            return {"dict": items}
        raise RecordError(
            f"{path}: cannot store a {type(node).__name__} in a record (tensors, NamedTuples, tuples, "
            "lists, dicts, None, bool, int, float and str can be stored)"
        )

    structure = encode(tree, "state")
    return ArrayRecord(arrays), ConfigRecord({"tree": json.dumps(structure), "format": 1})


def records_to_tree(arrays: ArrayRecord, structure: ConfigRecord, device: torch.device | str | None = None) -> Any:
    """The pytree `tree_to_records` flattened, its tensors on `device` (None: the CPU)."""
    if structure.get("format") != 1 or "tree" not in structure:
        raise RecordError("not a client-state record written by bayesadmm.flower.records")

    def decode(node):
        if "namedtuple" in node:
            return _namedtuple(node["namedtuple"])(*(decode(v) for v in node["items"]))
        ((kind, value),) = node.items()
        if kind == "tensor":
            return _tensor(arrays[str(value)], f"state tensor {value}", device)
        if kind == "none":
            return None
        if kind in ("bool", "int", "str"):
            return value
        if kind == "float":
            return float.fromhex(value)
        if kind == "tuple":
            return tuple(decode(v) for v in value)
        if kind == "list":
            return [decode(v) for v in value]
        if kind == "dict":
            return {decode(k): decode(v) for k, v in value}
        raise RecordError(f"unknown node {kind!r} in a client-state record")

    return decode(json.loads(str_entry(structure, "tree")))


def _namedtuple(name: str):
    module_name, _, qualname = name.partition(":")
    if module_name.split(".")[0] != TRUSTED_PACKAGE:
        raise RecordError(f"refusing to import {name}: client states only hold bayesadmm types")
    obj = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, tuple) and hasattr(obj, "_fields")):
        raise RecordError(f"{name} is not a NamedTuple")
    return obj


def save_state(state: RecordDict, tree: Any) -> None:
    """Store a client state in a Context.state RecordDict (replacing the previous one)."""
    arrays, structure = tree_to_records(tree)
    state[STATE_ARRAYS] = arrays
    state[STATE_TREE] = structure


def load_state(state: RecordDict, device: torch.device | str | None = None) -> Any | None:
    """The client state stored by `save_state` (its tensors on `device`), or None if this node has none yet (its
    first round)."""
    if STATE_TREE not in state:
        return None
    return records_to_tree(
        get_record(state, STATE_ARRAYS, ArrayRecord), get_record(state, STATE_TREE, ConfigRecord), device
    )


# --- run configuration ----------------------------------------------------------------------------------------------


def config_to_json(config: RunConfig) -> str:
    return json.dumps(config.to_json(), sort_keys=True)


def config_from_json(text: str) -> RunConfig:
    return RunConfig(**json.loads(text))


def numeric_metrics(info: Any) -> dict[str, float | int]:
    """The finite scalars of a client's info record (what fits a MetricRecord); the rest is dropped."""
    from bayesadmm.engine.loop import info_scalars

    return {key: value for key, value in info_scalars(info).items() if math.isfinite(value)}
