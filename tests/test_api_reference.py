"""The API reference (docs/api/*.md, mkdocstrings `::: path` directives) documents every public name of
`bayesadmm.__all__` and `bayesadmm.algorithms.__all__`, and every built-in method's module with its factory and
hyperparameters, so that a name added to the API cannot be left out of the reference."""

import importlib
import re
import sys
from pathlib import Path

import bayesadmm
from bayesadmm import algorithms

API = Path(__file__).resolve().parents[1] / "docs" / "api"
DIRECTIVE = re.compile(r"^::: (?P<path>[\w.]+)\n(?P<options>(?:[ \t]+\S.*\n)*)", re.MULTILINE)


def _resolve(path: str):
    """The object a directive's dotted path names (a module, or an attribute of the longest importable prefix)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def _shown(obj, options: str) -> list:
    """The object a directive documents and the members it shows: those of `members: [...]`, none for
    `members: false`, and otherwise (a whole module) the public objects the module defines."""
    members = re.search(r"members:\s*(.+)", options)
    if members and members.group(1).strip() == "false":
        return [obj]
    if members:
        names = [n.strip() for n in members.group(1).strip("[] \n").split(",") if n.strip()]
        return [obj] + [getattr(obj, name) for name in names]
    defined = getattr(obj, "__name__", None) if isinstance(obj, type(sys)) else None
    owned = [v for k, v in vars(obj).items() if not k.startswith("_") and getattr(v, "__module__", None) == defined]
    return [obj] + (owned if defined else [])


def _documented() -> tuple[list, str]:
    shown, text = [], ""
    for page in sorted(API.glob("*.md")):
        text += page.read_text()
        for match in DIRECTIVE.finditer(page.read_text()):
            shown += _shown(_resolve(match.group("path")), match.group("options"))
    return shown, text


def _in(obj, shown: list) -> bool:
    return any(obj is other for other in shown)  # identity: bayesadmm.run is bayesadmm.federated.run, documented once


def test_every_public_name_is_in_the_api_reference():
    shown, _ = _documented()
    missing = [f"bayesadmm.{n}" for n in bayesadmm.__all__ if not _in(getattr(bayesadmm, n), shown)]
    missing += [f"bayesadmm.algorithms.{n}" for n in algorithms.__all__ if not _in(getattr(algorithms, n), shown)]
    assert not missing, f"add to docs/api/*.md: {', '.join(missing)}"


def test_every_built_in_method_has_its_module_factory_and_hparams_in_the_api_reference():
    shown, text = _documented()
    built_in = [spec for spec in algorithms.specs() if spec.build.__module__.startswith("bayesadmm.algorithms.")]
    assert len(built_in) >= 14
    for spec in built_in:
        module = sys.modules[spec.build.__module__]
        assert _in(module, shown) and _in(module.make, shown), f"{module.__name__} (make) is not in docs/api"
        assert _in(spec.hparams, shown), f"{spec.name}'s {spec.hparams.__qualname__} is not in docs/api"
        assert f"| `{spec.name}` | `{module.__name__}` |" in text, f"{spec.name} is not in docs/api/methods.md's table"
