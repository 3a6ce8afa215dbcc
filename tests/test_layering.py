"""The package's layering, read from the source: each layer imports only the layers below it.

    base (schemas, log, config loader, procs, the tiny model, …)  ←  client  ←  rows (recorded calls
    to training rows: aggregation, rewards)  ←  {server, controller, trainer}
    trainer  ←  backends (torch_backend, verl: neither imports the other)  ←  demo, evaluation
    ←  commands (`agl` and its subcommands)

Every import counts, lazy ones inside functions too: a lazy import is still a dependency (the
Gateway would import the trainer the first time the dashboard route ran). Under all of them: the
package imports nothing of the repository's tests, benchmarks or examples (the test doubles,
tests/fakes/, are not in the wheel). Run it as a script
on any tree to count the modules that import across layers:
`python tests/test_layering.py path/to/repo`.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

# Layer of each top-level name under agentlightning/ (a module or a package).
LAYERS: dict[str, str] = {
    "__init__": "base",
    "__main__": "base",
    "schemas": "base",
    "log": "base",
    "config": "base",
    "procs": "base",
    "hooks": "base",
    "sandbox": "base",
    "wire": "base",
    "model_call": "base",  # the record of a model call and its training view (TypedDicts)
    "launch": "base",
    "openai_server": "base",
    "agent_events": "base",  # what agents import (httpx only): their reward post
    "tiny_model": "base",  # the built-in tiny policy: the torch backend's `demo` model
    "rows": "rows",
    "aggregation": "rows",
    "rewards": "rows",
    "client": "client",
    "server": "server",
    "controller": "controller",
    "trainer": "trainer",
    "torch_backend": "torch_backend",
    "verl": "verl",
    "demo": "demo",
    "evaluation": "evaluation",
    "doctor": "doctor",
    "cli": "commands",
    "commands": "commands",
}

# What each layer may import (besides itself).
ALLOWED: dict[str, set[str]] = {
    "base": set(),
    "client": {"base"},
    "rows": {"base", "client"},
    "server": {"base", "client", "rows"},
    "controller": {"base", "client", "rows"},
    "trainer": {"base", "client", "rows"},
    "torch_backend": {"base", "client", "rows", "trainer"},
    "verl": {"base", "client", "rows", "trainer"},
    "demo": {"base", "client", "rows", "server", "controller", "trainer", "torch_backend"},
    # agl-eval: starts the services by command line (launch), reads the store (client), loads
    # data and checkpoints (trainer), writes checkpoints out as model folders (torch_backend)
    "evaluation": {"base", "client", "rows", "trainer", "torch_backend"},
    # agl-doctor: starts the services by command line (launch), reads the store (client), makes
    # training rows of what it read (rows)
    "doctor": {"base", "client", "rows"},
    # `agl` and its own subcommands (train, init): the top, they start and call every component
    "commands": {
        "base", "client", "rows", "server", "controller", "trainer", "torch_backend", "verl", "demo", "evaluation",
    },
}  # fmt: skip

# Known crossings still to be removed, each with the change that removes it. The test fails when
# one of them is gone too, so that the entry is deleted with the import.
KNOWN: dict[tuple[str, str], str] = {}

ROOT = Path(__file__).resolve().parent.parent


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the nodes inside `if TYPE_CHECKING:` blocks."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def imported_modules(path: Path, module: str, runtime_only: bool = False) -> set[str]:
    """Every `agentlightning.*` module `path` imports, at any depth (relative imports resolved);
    `runtime_only`: not those under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    skip = _type_checking_only(tree) if runtime_only else set()
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            out.update(f"{name}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return {m for m in out if m == "agentlightning" or m.startswith("agentlightning.")}


# Top-level folders of the repository that are not in the wheel.
OUTSIDE_THE_PACKAGE = ("tests", "bench", "examples")


def imports_from_outside(path: Path) -> set[str]:
    """The modules of `OUTSIDE_THE_PACKAGE` that `path` imports (absolute imports; a relative one
    stays inside the package)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
    return {n for n in names if n.split(".")[0] in OUTSIDE_THE_PACKAGE}


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 2:
        return "base"
    return LAYERS.get(parts[1])


def crossings(root: Path) -> tuple[dict[str, set[str]], list[str]]:
    """{module: layers it may not import} for every module under `root`/agentlightning, and the
    modules with no layer assigned."""
    bad: dict[str, set[str]] = {}
    unassigned: list[str] = []
    package = root / "agentlightning"
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        layer = layer_of(module)
        if layer is None:
            unassigned.append(module)
            continue
        for target in imported_modules(path, module):
            other = layer_of(target)
            if other is None or other == layer or other in ALLOWED[layer]:
                continue
            bad.setdefault(module, set()).add(other)
    return bad, unassigned


def module_graph(root: Path) -> dict[str, set[str]]:
    """{module: the package modules it imports}; `from pkg import name` counts as `pkg.name` where
    that is a module, else as `pkg`."""
    files = {}
    for path in sorted((root / "agentlightning").rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        files[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        targets = {t for t in imported_modules(path, module, runtime_only=True) if t in files}
        graph[module] = {t for t in targets if t != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import each other at run time, directly or through others (Tarjan's
    SCCs; imports for type checking only do not count). A package's `__init__` re-exporting its modules is not counted: edges into a package are
    left out."""
    packages = {m for m in graph if any(o.startswith(f"{m}.") for o in graph)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v] - packages:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    assert not cycles(module_graph(ROOT))


def test_every_module_has_a_layer() -> None:
    _, unassigned = crossings(ROOT)
    assert not unassigned, f"give these a layer in LAYERS: {unassigned}"


def test_the_package_imports_nothing_outside_it() -> None:
    found = {
        str(path.relative_to(ROOT)): sorted(names)
        for path in sorted((ROOT / "agentlightning").rglob("*.py"))
        if (names := imports_from_outside(path))
    }
    assert not found, f"the package imports what the wheel does not hold: {found}"


def test_layers_import_only_what_they_may() -> None:
    bad, _ = crossings(ROOT)
    found = {(m, layer) for m, layers in bad.items() for layer in layers}
    new = sorted(found - set(KNOWN))
    assert not new, "imports across layers (module, layer it may not import): " + ", ".join(map(str, new))
    gone = sorted(set(KNOWN) - found)
    assert not gone, f"no longer crossing, delete from KNOWN: {gone}"


if __name__ == "__main__":
    tree = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    bad, unassigned = crossings(tree)
    for module, layers in sorted(bad.items()):
        print(f"{module} -> {', '.join(sorted(layers))}")
    print(f"modules importing across layers: {len(bad)}; without a layer: {len(unassigned)} {unassigned}")
    print(f"import cycles: {cycles(module_graph(tree))}")
