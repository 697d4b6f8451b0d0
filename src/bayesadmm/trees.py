"""States (pytrees of tensors) as a JSON structure plus a list of tensors, so they can be stored without pickle.

A tree is made of tensors, None, bools, ints, floats, strings, tuples, lists, dicts with int or str keys, and
NamedTuples and dataclasses of these. `flatten` gives the structure (JSON-able; floats as exact hex strings, since
JSON has no nan or inf) and the tensors in traversal order; `unflatten` rebuilds the tree.

Classes are stored as ``module:qualname`` and rebuilt only from an explicit registry of state classes: the library
registers its algorithms' states where it defines them (`@trees.register`), and an algorithm of a user's own adds its
own with one call, ``bayesadmm.trees.register(MyState)``. A name that is not in the registry is refused: reading a
file never imports a module it names, nor calls anything but the constructor of a registered state class. Writing
refuses an unregistered class too, so that a run finds out at its first checkpoint, not at its resume.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "TreeError",
    "flatten",
    "unflatten",
    "register",
    "registered",
    "resolve_registered",
    "check_registered",
    "hash_tensors",
]


class TreeError(ValueError):
    """A value that is not a storable tree, or a structure this module did not write."""


def _is_namedtuple(kind: type) -> bool:
    return issubclass(kind, tuple) and hasattr(kind, "_fields")


# "module:qualname" → the state class of that name; filled in by `register`, read by `resolve_registered`
_REGISTRY: dict[str, type] = {}


def _name(kind: type) -> str:
    return f"{kind.__module__}:{kind.__qualname__}"


def register(*kinds: type) -> Any:
    """Allow the NamedTuple or dataclass types `kinds` in stored states; returns the (first) type, so that it can be
    used as a class decorator. Call it once for each state class of an algorithm of your own."""
    for kind in kinds:
        if not (isinstance(kind, type) and (_is_namedtuple(kind) or dataclasses.is_dataclass(kind))):
            raise TypeError(f"register takes NamedTuple and dataclass types, not {kind!r}")
        other = _REGISTRY.setdefault(_name(kind), kind)
        if other is not kind:  # two classes of one name could not be told apart when read back
            raise TypeError(f"another class named {_name(kind)} is registered already; rename one of them")
    return kinds[0] if kinds else None


def registered() -> dict[str, type]:
    """The registered state classes, by their stored name (a copy)."""
    return dict(_REGISTRY)


def resolve_registered(name: str) -> type:
    """The registered state class stored as `name` (``module:qualname``); a TreeError for any other name (nothing is
    imported or looked up elsewhere)."""
    kind = _REGISTRY.get(name) if isinstance(name, str) else None
    if kind is None:
        shown = name if isinstance(name, str) and name.isprintable() and len(name) <= 200 else repr(name)[:200]
        raise TreeError(
            f"refusing {shown}: not a registered state class (an algorithm of your own registers its states with "
            "bayesadmm.trees.register(MyState))"
        )
    return kind


def check_registered(kind: type, path: str) -> None:
    """`flatten`'s default check: only registered classes are stored (they are the only ones that can be read)."""
    if _REGISTRY.get(_name(kind)) is not kind:
        raise TreeError(
            f"{path}: {_name(kind)} is not a registered state class; call bayesadmm.trees.register({kind.__name__}) "
            "once after defining it"
        )


def flatten(tree: Any, check: Callable[[type, str], None] = check_registered) -> tuple[dict, list[Tensor]]:
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


def unflatten(structure: dict, tensors: Sequence[Tensor], resolve: Callable[[str], type] = resolve_registered) -> Any:
    """The tree `flatten` described: tensors taken from `tensors`, classes from `resolve("module:qualname")`."""

    def build(name: str, args: list, kwargs: dict) -> Any:
        kind = resolve(name)
        try:
            return kind(*args, **kwargs)
        except (TypeError, ValueError) as exc:  # wrong fields for the class: a file this module did not write
            raise TreeError(f"{name}: {exc}") from None

    def decode(node: Any) -> Any:
        if not isinstance(node, dict):
            raise TreeError(f"malformed tree node {node!r}")
        if "namedtuple" in node:
            return build(node["namedtuple"], [decode(v) for v in _items(node, "items")], {})
        if "dataclass" in node:
            fields = _items(node, "fields")
            if not all(isinstance(f, list) and len(f) == 2 and isinstance(f[0], str) for f in fields):
                raise TreeError(f"malformed dataclass fields in {node['dataclass']!r}")
            return build(node["dataclass"], [], {name: decode(v) for name, v in fields})
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
        if kind in ("tuple", "list", "dict") and not isinstance(value, list):
            raise TreeError(f"malformed tree node {node!r}")
        if kind == "tuple":
            return tuple(decode(v) for v in value)
        if kind == "list":
            return [decode(v) for v in value]
        if kind == "dict":
            if not all(isinstance(pair, list) and len(pair) == 2 for pair in value):
                raise TreeError(f"malformed dict node {node!r}")
            keys = [decode(k) for k, _ in value]
            if not all(isinstance(k, (int, str)) for k in keys):
                raise TreeError(f"dict keys must be int or str, got {keys!r}")
            return {k: decode(v) for k, (_, v) in zip(keys, value, strict=True)}
        raise TreeError(f"unknown tree node {kind!r}")

    return decode(structure)


def _items(node: dict, key: str) -> list:
    value = node.get(key)
    if not isinstance(value, list):
        raise TreeError(f"malformed tree node: {key} of {node.get('namedtuple') or node.get('dataclass')!r}")
    return value


def hash_tensors(digest: Any, tensors: Sequence[Tensor]) -> Any:
    """Feed each tensor's dtype, shape and bytes to the hashlib object `digest` (in order); returns `digest`."""
    for tensor in tensors:
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{flat.dtype}{tuple(tensor.shape)};".encode())
        digest.update(flat.view(torch.uint8).numpy())  # the raw bytes, without a copy
    return digest
