"""The package's imports, read from its source (no module is imported): no import circle between its modules, counting
imports inside functions and the package `__init__`s an import runs first, and the package's own modules imported
inside a function only where that defers an optional dependency (docs/architecture.md). Imports under
`if TYPE_CHECKING:` are not imports at run time; an import of one's own ancestor package (`import bayesadmm` in
`bayesadmm.engine.provenance`) is already done when the module runs, so neither counts."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
# the optional extras' imports (pyproject.toml): a module importing one of these is imported where it is needed
OPTIONAL = {"flwr", "optuna", "mlflow", "tensorboard", "sklearn", "mlxtend", "opacus"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted((SRC / "bayesadmm").rglob("*.py")):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _own(name: str) -> str | None:
    """The package's module that an import of `name` loads (the longest prefix that is one), or None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> list[tuple[str, bool]]:
    """(imported name, inside a function) of every import `module` runs, TYPE_CHECKING blocks left out."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, inner) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                found.extend((f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base, inner)
                             for alias in child.names)  # fmt: skip
            visit(child, inner)

    visit(ast.parse(path.read_text()), False)
    return found


def _edges(module: str) -> list[tuple[str, bool]]:
    """The package's modules `module` imports (inside a function or not), its own ancestors left out."""
    targets = [(_own(name), local) for name, local in _imports(module)]
    return [(t, local) for t, local in targets if t and t != module and not module.startswith(t + ".")]


def _runs(module: str) -> set[str]:
    """The package's modules that importing from `module` runs: each module it imports and that module's ancestor
    packages (importing `bayesadmm.privacy.settings` runs `bayesadmm/privacy/__init__.py` first), its own ancestors
    left out."""
    ran = set()
    for target, _ in _edges(module):
        parts = target.split(".")
        ran.update(
            ancestor
            for ancestor in (".".join(parts[:i]) for i in range(2, len(parts) + 1))
            if ancestor in MODULES and ancestor != module and not module.startswith(ancestor + ".")
        )
    return ran


def _reaches_optional(module: str, seen: set[str]) -> bool:
    """Whether importing `module` imports an optional dependency (through the package's modules, at module level)."""
    if module in seen:
        return False
    seen.add(module)
    if any(name.split(".")[0] in OPTIONAL for name, local in _imports(module) if not local):
        return True
    return any(_reaches_optional(t, seen) for t, local in _edges(module) if not local)


def test_no_import_circle_between_the_packages_modules_counting_imports_inside_functions_and_package_inits():
    graph = {m: sorted(_runs(m)) for m in MODULES}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def walk(module: str, stack: list[str]) -> list[str] | None:
        state[module] = 1
        stack.append(module)
        for target in graph[module]:
            if state.get(target) == 1:
                return stack[stack.index(target) :] + [target]
            if target not in state and (circle := walk(target, stack)):
                return circle
        stack.pop()
        state[module] = 2
        return None

    for module in MODULES:
        if module not in state:
            circle = walk(module, [])
            assert circle is None, f"import circle: {' -> '.join(circle)}"


def test_the_packages_own_modules_are_imported_inside_functions_only_to_defer_an_optional_dependency():
    deferred = [
        (module, target)
        for module in MODULES
        for target, local in _edges(module)
        if local and not _reaches_optional(target, set())
    ]
    assert not deferred, f"import these at the top of the module (nothing optional to defer): {deferred}"
