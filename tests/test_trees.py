"""States as a JSON structure plus tensors (bayesadmm.trees): exact round trips, and only registered state classes."""

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


class Unregistered(NamedTuple):
    x: int


trees.register(Pair, Box)


def test_round_trip_is_exact():
    tree = {0: Pair(torch.randn(3), None), "b": [Box((torch.arange(2), 1e-300), math.nan), (True, -3, "s")],
            7: ServerInfo(clients=4), "inf": -math.inf}
    structure, tensors = trees.flatten(tree)
    back = trees.unflatten(json.loads(json.dumps(structure)), tensors)
    assert torch.equal(back[0].first, tree[0].first) and back[0].second is None
    assert type(back["b"][0]) is Box and back["b"][0].values[1] == 1e-300 and math.isnan(back["b"][0].scale)
    assert back["b"][1] == (True, -3, "s") and back[7] == ServerInfo(clients=4) and back["inf"] == -math.inf


def test_only_registered_state_classes_are_rebuilt_and_nothing_is_imported():
    import sys

    # a function, a module's attribute, the CLI's module (importing it once re-ran the command line), a class of a
    # module nobody imported, the tune dataclass that reads a file when built: none is registered, none is touched
    for name in ("bayesadmm.engine.loop:run_federation", "os:system", "bayesadmm.__main__:X",
                 "some_module_nobody_imported:Thing", "bayesadmm.experiments.tune:Space", 7):
        with pytest.raises(trees.TreeError, match="not a registered state class"):
            trees.unflatten({"namedtuple": name, "items": []}, [])
    assert "some_module_nobody_imported" not in sys.modules
    assert trees.resolve_registered(f"{Pair.__module__}:Pair") is Pair
    assert trees.registered()["bayesadmm.algorithms.fedavg:ClientState"].__name__ == "ClientState"
    with pytest.raises(trees.TreeError, match=r"register\(Unregistered\)"):   # refused when written, not resumed
        trees.flatten({"a": Unregistered(1)})
    with pytest.raises(TypeError, match="NamedTuple and dataclass types"):
        trees.register(dict)
    with pytest.raises(trees.TreeError, match="cannot store a object"):
        trees.flatten([object()])
    with pytest.raises(trees.TreeError, match="tree names tensor 3 of 0"):
        trees.unflatten({"tensor": 3}, [])
    for malformed in ({"namedtuple": f"{Pair.__module__}:Pair", "items": 5}, {"list": 3}, {"dict": [[{"list": []},
                      {"none": True}]]}, {"namedtuple": f"{Pair.__module__}:Pair", "items": []}):
        with pytest.raises(trees.TreeError):
            trees.unflatten(malformed, [])


def test_the_module_main_runs_nothing_when_imported():
    import importlib

    importlib.import_module("bayesadmm.__main__")   # was sys.exit(main()): a usage error and SystemExit
