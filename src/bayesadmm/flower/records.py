"""Lossless conversion between bayesadmm's values and Flower's records.

Three conversions, none of which knows anything about an algorithm:

* a `Message` (flat ``dict[str, Tensor]``) <-> an `ArrayRecord`, key for key, dtype and shape kept;
* a client state (a pytree: NamedTuples, tuples, lists, dicts, tensors, None, bools, ints, floats, strings) <->
  an `ArrayRecord` of its tensors plus a `ConfigRecord` holding the tree's structure as JSON, so a SuperNode can
  keep an algorithm's per-client state (duals, local posteriors) in its `Context.state` between rounds without
  pickling arbitrary objects;
* a `RunConfig` <-> a JSON string inside a `ConfigRecord`.

The tree's encoding is `bayesadmm.trees` (shared with the engine's checkpoints). NamedTuple and dataclass types are
stored by ``module:qualname`` and rebuilt, as in checkpoints, only from the registry of state classes
(`bayesadmm.trees.register`: the library's, and a user's algorithm's own, registered where they are defined), so
reading a state never imports a module it names, runs other code, or unpickles anything.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from torch import Tensor

from bayesadmm import trees
from bayesadmm.algorithms.base import info_scalars
from bayesadmm.experiments.config import RunConfig

STATE_ARRAYS = "bayesadmm.client-state"
STATE_TREE = "bayesadmm.client-state.tree"
STATE_VERSION = "version"


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
    """Flatten `tree` (`bayesadmm.trees`) into its tensors (keys "0", "1", ... in traversal order) and a JSON
    description of the rest."""
    try:
        structure, tensors = trees.flatten(tree)
    except trees.TreeError as exc:
        raise RecordError(str(exc)) from None
    arrays = {str(i): _array(tensor, f"state tensor {i}") for i, tensor in enumerate(tensors)}
    return ArrayRecord(arrays), ConfigRecord({"tree": json.dumps(structure), "format": 1})


def records_to_tree(arrays: ArrayRecord, structure: ConfigRecord, device: torch.device | str | None = None) -> Any:
    """The pytree `tree_to_records` flattened, its tensors on `device` (None: the CPU)."""
    if structure.get("format") != 1 or "tree" not in structure:
        raise RecordError("not a client-state record written by bayesadmm.flower.records")
    try:
        tensors = [_tensor(arrays[str(i)], f"state tensor {i}", device) for i in range(len(arrays))]
        return trees.unflatten(json.loads(str_entry(structure, "tree")), tensors)
    except RecordError:
        raise
    except (ValueError, KeyError, RecursionError) as exc:  # TreeError and JSON's errors are ValueErrors
        raise RecordError(f"a client-state record that does not decode ({type(exc).__name__}: {exc})") from None


def save_state(state: RecordDict, tree: Any, version: str = "") -> None:
    """Store a client state in a RecordDict (a Context.state, or a message's content), replacing the previous one;
    `version` names which state it is (the server's label of the client's last update)."""
    arrays, structure = tree_to_records(tree)
    structure[STATE_VERSION] = version
    state[STATE_ARRAYS] = arrays
    state[STATE_TREE] = structure


def load_state(state: RecordDict, device: torch.device | str | None = None) -> Any | None:
    """The client state stored by `save_state` (its tensors on `device`), or None if there is none."""
    if STATE_TREE not in state:
        return None
    return records_to_tree(
        get_record(state, STATE_ARRAYS, ArrayRecord), get_record(state, STATE_TREE, ConfigRecord), device
    )


def state_version(state: RecordDict) -> str | None:
    """The version `save_state` stored with the state in `state`, or None if it holds no state."""
    if STATE_TREE not in state:
        return None
    return str(get_record(state, STATE_TREE, ConfigRecord).get(STATE_VERSION, ""))


# --- run configuration ----------------------------------------------------------------------------------------------


def config_to_json(config: RunConfig) -> str:
    return json.dumps(config.to_json(), sort_keys=True)


def config_from_json(text: str) -> RunConfig:
    return RunConfig(**json.loads(text))


def numeric_metrics(info: Any) -> dict[str, float | int]:
    """The finite scalars of a client's info record (what fits a MetricRecord); the rest is dropped."""
    return {key: value for key, value in info_scalars(info).items() if math.isfinite(value)}
