"""Which of a round's decoded train replies the server takes: a reply is data from another machine, and one node
whose arrays are missing, mis-shaped, of another dtype or non-finite must not end the federation (the server update
would fail on it, or silently compute with it). `refusals` says, for each refused client, why.

A reply is held to what the server expects:

* its arrays finite and its metrics finite numbers (an honest node sends no other: `records.numeric_metrics`);
* its client state shaped as the server's copy of that client's previous state (`state_problem`);
* its arrays laid out (keys, dtypes, shapes) as the client's own last accepted reply, or, for a client that has not
  replied yet, as the run's replies are (`Reference`, learnt from the first replies: the layout most of them share).
  The leading dimension of `PER_CLIENT_ROWS` keys (FedLap-func's memory points, as many as the client's classes
  allow) is each client's own.

Before any reply has been accepted, the layout is the one a strict majority of the round's replies share; replies
that disagree with no majority (two nodes, one wrong) cannot be told apart, and are all refused, naming the clash.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from bayesadmm.algorithms.function_space import MEMORY_KEYS

# message keys whose leading dimension is the client's own (FedLap-func's memory: points of the classes it holds)
PER_CLIENT_ROWS = frozenset(MEMORY_KEYS)

# a reply's layout: key → (dtype, shape), the shape without its leading dimension for `PER_CLIENT_ROWS` keys
Layout = dict[str, tuple[torch.dtype, tuple[int, ...]]]


def layout(message: Mapping[str, Tensor], exact: bool = False) -> Layout:
    """The keys, dtypes and shapes of `message` (`exact`: every dimension, else the `PER_CLIENT_ROWS` keys without
    their leading one)."""
    found = {}
    for key, tensor in message.items():
        shape = tuple(tensor.shape)
        found[key] = (tensor.dtype, shape if exact or key not in PER_CLIENT_ROWS else shape[1:])
    return found


def layout_problem(message: Mapping[str, Tensor], expected: Layout, exact: bool = False) -> str | None:
    """What in `message` differs from the `expected` layout (the first difference), or None."""
    missing = [key for key in expected if key not in message]
    if missing:
        return f"arrays {missing[:3]} are missing"
    extra = [key for key in message if key not in expected]
    if extra:  # names a node chose: shown escaped (repr) and cut short
        return f"arrays {[key if len(key) <= 40 else key[:40] + '...' for key in extra[:3]]} are not the method's"
    found = layout(message, exact)
    for key, (dtype, shape) in expected.items():
        if found[key][0] != dtype:
            return f"array {key!r} is {found[key][0]}, expected {dtype}"
        if found[key][1] != shape:
            where = "" if exact or key not in PER_CLIENT_ROWS else " (after its leading dimension)"
            return f"array {key!r} has shape {list(found[key][1])}{where}, expected {list(shape)}"
    return None


def value_problem(message: Mapping[str, Tensor], info: Mapping[str, float]) -> str | None:
    """Non-finite values in the arrays or the metrics, or None."""
    for key, tensor in message.items():
        if (tensor.is_floating_point() or tensor.is_complex()) and not bool(torch.isfinite(tensor).all()):
            return f"array {key!r} holds non-finite values"
    for key, value in info.items():
        if not math.isfinite(value):
            return f"metric {key!r} is {value}"
    return None


def state_problem(new: Any, old: Any, where: str = "state") -> str | None:
    """How the client state `new` a node sent differs in structure from the server's copy `old` of the previous one
    (None: it does not): the same classes, tuples and tensors (dtype and shape); a None of `old` (a part the first
    update fills, as a client's first posterior) may become anything, a list may grow or shrink and a dict gain keys
    (a history a method of your own keeps), their common entries compared."""
    if old is None:
        return None
    if isinstance(old, Tensor):
        if not isinstance(new, Tensor):
            return f"{where} is a {type(new).__name__}, expected a tensor"
        if new.dtype != old.dtype or new.shape != old.shape:
            return f"{where} is {new.dtype} {list(new.shape)}, expected {old.dtype} {list(old.shape)}"
        return None
    if type(new) is not type(old):
        return f"{where} is a {type(new).__name__}, expected a {type(old).__name__}"
    if dataclasses.is_dataclass(old) and not isinstance(old, type):
        pairs = [(f.name, getattr(new, f.name), getattr(old, f.name)) for f in dataclasses.fields(old)]
    elif isinstance(old, tuple) and hasattr(old, "_fields"):
        pairs = [(name, getattr(new, name), getattr(old, name)) for name in old._fields]
    elif isinstance(old, tuple):
        if len(new) != len(old):
            return f"{where} has {len(new)} entries, expected {len(old)}"
        pairs = [(str(i), a, b) for i, (a, b) in enumerate(zip(new, old, strict=True))]
    elif isinstance(old, list):
        pairs = [(str(i), a, b) for i, (a, b) in enumerate(zip(new, old, strict=False))]
    elif isinstance(old, dict):
        lost = [key for key in old if key not in new]
        if lost:
            return f"{where} has no key {lost[0]!r}"
        pairs = [(str(key), new[key], old[key]) for key in old]
    else:
        return None  # a scalar of the same type
    for name, a, b in pairs:
        problem = state_problem(a, b, f"{where}.{name}")
        if problem:
            return problem
    return None


class Reference:
    """The layout of the run's replies, learnt from the first accepted ones; and each client's own last layout."""

    def __init__(self) -> None:
        self.run: Layout | None = None
        self.clients: dict[int, Layout] = {}

    def expected(self, k: int) -> tuple[Layout | None, bool]:
        """(the layout client k's reply must have, whether exactly: its own last one), None while none is known."""
        if k in self.clients:
            return self.clients[k], True
        return self.run, False

    def accepted(self, k: int, message: Mapping[str, Tensor]) -> None:
        self.clients[k] = layout(message, exact=True)
        if self.run is None:
            self.run = layout(message)


def refusals(
    replies: Mapping[int, tuple[Mapping[str, Tensor], Any, Mapping[str, float]]],
    states: Mapping[int, Any],
    reference: Reference,
) -> dict[int, str]:
    """{client: why its reply is refused} for the round's decoded `replies` ({client: (message, new state, info)}),
    against the server's copies of the previous `states` and the `reference` layouts (which the caller updates with
    the replies it takes: `Reference.accepted`)."""
    refused: dict[int, str] = {}
    for k, (message, state, info) in replies.items():
        problem = value_problem(message, info) or state_problem(state, states.get(k), "its client state")
        if problem:
            refused[k] = problem
    unknown = [k for k in replies if k not in refused and reference.expected(k)[0] is None]
    majority: Layout | None = None
    if unknown:  # no layout known yet: the one most of them share
        shared = Counter(_signature(layout(replies[k][0])) for k in unknown)
        ((common, count),) = shared.most_common(1)
        if 2 * count > len(unknown):
            majority = dict(common)
        else:
            clash = f"the first replies disagree on their arrays ({len(shared)} layouts among {len(unknown)} clients)"
            refused.update({k: clash + ", and none is known to be right" for k in unknown})
    for k, (message, _, _) in replies.items():
        if k in refused:
            continue
        expected, exact = reference.expected(k)
        if expected is None:
            expected, exact = majority, False
        assert expected is not None
        problem = layout_problem(message, expected, exact)
        if problem:
            refused[k] = problem
    return refused


def _signature(found: Layout) -> tuple:
    return tuple(sorted(found.items(), key=lambda item: item[0]))
