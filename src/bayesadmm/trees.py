"""States (pytrees of tensors) as a JSON structure plus a list of tensors, so they can be stored without pickle.

A tree is made of tensors, None, bools, ints, floats, strings, tuples, lists, dicts with int or str keys, and
NamedTuples and dataclasses of these. `flatten` gives the structure (JSON-able; floats as exact hex strings, since
JSON has no nan or inf) and the tensors in traversal order; `unflatten` rebuilds the tree. Classes are stored as
``module:qualname`` and rebuilt only through a `resolve` function the reader chooses: `resolve_known` accepts
NamedTuples and dataclasses from the bayesadmm package or from modules the process has already imported (the
algorithm being resumed has imported its own), so reading a file never imports a module it names or calls anything
that is not a state class.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor

__all__ = ["TreeError", "flatten", "unflatten", "resolve_known", "TRUSTED_PACKAGE"]

TRUSTED_PACKAGE = "bayesadmm"


class TreeError(ValueError):
    """A value that is not a storable tree, or a structure this module did not write."""


def _is_namedtuple(kind: type) -> bool:
    return issubclass(kind, tuple) and hasattr(kind, "_fields")


def _any_type(kind: type, path: str) -> None:
    pass


def flatten(tree: Any, check: Callable[[type, str], None] = _any_type) -> tuple[dict, list[Tensor]]:
    """(structure, tensors) of `tree`; `check(type, path)` is called on every NamedTuple and dataclass type and may
    refuse it by raising."""
    tensors: list[Tensor] = []

    def encode(node: Any, path: str) -> dict:
        if isinstance(node, Tensor):
            tensors.append(node)
            return {"tensor": len(tensors) - 1}
        if node is None:
            return {"none": True}
        if isinstance(node, bool):
            return {"bool": node}
        if isinstance(node, int):
            return {"int": node}
        if isinstance(node, float):
            return {"float": node.hex()}
        if isinstance(node, str):
            return {"str": node}
        kind = type(node)
        if _is_namedtuple(kind) or (dataclasses.is_dataclass(node) and not isinstance(node, type)):
            check(kind, path)
            name = f"{kind.__module__}:{kind.__qualname__}"
            if _is_namedtuple(kind):
                items = [encode(v, f"{path}.{f}") for f, v in zip(node._fields, node, strict=True)]
                return {"namedtuple": name, "items": items}
            fields = [f for f in dataclasses.fields(node) if f.init]
            return {
                "dataclass": name,
                "fields": [[f.name, encode(getattr(node, f.name), f"{path}.{f.name}")] for f in fields],
            }
        if isinstance(node, tuple):
            return {"tuple": [encode(v, f"{path}[{i}]") for i, v in enumerate(node)]}
        if isinstance(node, list):
            return {"list": [encode(v, f"{path}[{i}]") for i, v in enumerate(node)]}
        if isinstance(node, dict):
            pairs: list[list[dict]] = []
            for key, value in node.items():
                if isinstance(key, bool) or not isinstance(key, (int, str)):
                    raise TreeError(f"{path}: dict keys must be int or str, got {key!r}")
                pairs.append([encode(key, path), encode(value, f"{path}[{key!r}]")])
            return {"dict": pairs}
        raise TreeError(
            f"{path}: cannot store a {kind.__name__} (tensors, NamedTuples, dataclasses, tuples, lists, dicts, None, "
            "bool, int, float and str can be stored)"
        )

    return encode(tree, "state"), tensors


def unflatten(structure: dict, tensors: Sequence[Tensor], resolve: Callable[[str], type]) -> Any:
    """The tree `flatten` described: tensors taken from `tensors`, classes from `resolve("module:qualname")`."""

    def decode(node: Any) -> Any:
        if not isinstance(node, dict):
            raise TreeError(f"malformed tree node {node!r}")
        if "namedtuple" in node:
            return resolve(node["namedtuple"])(*(decode(v) for v in node["items"]))
        if "dataclass" in node:
            return resolve(node["dataclass"])(**{name: decode(v) for name, v in node["fields"]})
        if len(node) != 1:
            raise TreeError(f"malformed tree node {node!r}")
        ((kind, value),) = node.items()
        if kind == "tensor":
            if not isinstance(value, int) or not 0 <= value < len(tensors):
                raise TreeError(f"tree names tensor {value!r} of {len(tensors)}")
            return tensors[value]
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
        raise TreeError(f"unknown tree node {kind!r}")

    return decode(structure)


def resolve_known(name: str) -> type:
    """The NamedTuple or dataclass `module:qualname` from the bayesadmm package (imported if needed) or from a module
    this process has already imported; a TreeError for anything else (nothing else is imported or called)."""
    module_name, _, qualname = name.partition(":")
    if module_name.split(".")[0] == TRUSTED_PACKAGE:
        module = importlib.import_module(module_name)
    elif module_name in sys.modules:
        module = sys.modules[module_name]
    else:
        raise TreeError(f"refusing {name}: its module is neither bayesadmm's nor imported by this process")
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if not (isinstance(obj, type) and (_is_namedtuple(obj) or dataclasses.is_dataclass(obj))):
        raise TreeError(f"refusing {name}: not a NamedTuple or dataclass")
    return obj
