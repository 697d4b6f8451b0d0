"""States as a JSON structure plus tensors (bayesadmm.trees): exact round trips, and nothing outside state classes."""

import dataclasses
import json
import math
from typing import NamedTuple

import pytest
import torch

from bayesadmm import trees
from bayesadmm.algorithms.base import ServerInfo


class Pair(NamedTuple):
    first: torch.Tensor
    second: object


@dataclasses.dataclass(frozen=True)
class Box:
    values: tuple
    scale: float = 1.0


def test_round_trip_is_exact():
    tree = {0: Pair(torch.randn(3), None), "b": [Box((torch.arange(2), 1e-300), math.nan), (True, -3, "s")],
            7: ServerInfo(clients=4), "inf": -math.inf}
    structure, tensors = trees.flatten(tree)
    back = trees.unflatten(json.loads(json.dumps(structure)), tensors, trees.resolve_known)
    assert torch.equal(back[0].first, tree[0].first) and back[0].second is None
    assert type(back["b"][0]) is Box and back["b"][0].values[1] == 1e-300 and math.isnan(back["b"][0].scale)
    assert back["b"][1] == (True, -3, "s") and back[7] == ServerInfo(clients=4) and back["inf"] == -math.inf


def test_only_state_classes_of_known_modules_are_rebuilt():
    with pytest.raises(trees.TreeError, match="not a NamedTuple or dataclass"):
        trees.resolve_known("bayesadmm.engine.loop:run_federation")
    with pytest.raises(trees.TreeError, match="neither bayesadmm's nor imported"):
        trees.resolve_known("some_module_nobody_imported:Thing")
    with pytest.raises(trees.TreeError, match="not a NamedTuple or dataclass"):
        trees.resolve_known("os:system")
    with pytest.raises(trees.TreeError, match="cannot store a object"):
        trees.flatten([object()])
    with pytest.raises(trees.TreeError, match="tree names tensor 3 of 0"):
        trees.unflatten({"tensor": 3}, [], trees.resolve_known)
