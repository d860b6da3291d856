"""The layers of docs/architecture.md, checked on the code: what each package may import.

Every ``import`` and ``from ... import`` of every module (at any depth, inside functions
too) is read from its source, resolved to the rdc module it names, and checked against
the layer rules. A cycle between two modules is refused too.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parent.parent
PACKAGES = {"rdc": TOP / "rdc", "rdc_server": TOP / "server" / "rdc_server",
            "rdc_client": TOP / "client" / "rdc_client"}

# Layer of each part of rdc, lowest first; a module may import from its own layer's
# package and from the packages of lower layers (and the shared leaves).
LAYERS = ["rdc._native", "rdc.content", "rdc.local", "rdc.wire", "rdc.transfer"]
LEAVES = {"rdc", "rdc.errors", "rdc.params", "rdc.records"}  # importable from everywhere in rdc
SIDE_PACKAGES = {  # packages beside the layers, with what they may import
    "rdc.storage": {"rdc.storage"},
    "rdc.repo": {"rdc.repo", "rdc.storage", *LAYERS},
}


def modules() -> dict[str, Path]:
    out = {}
    for name, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            rel = path.relative_to(root).with_suffix("")
            parts = [name, *rel.parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports(module: str, path: Path) -> set[str]:
    """The rdc, rdc_server and rdc_client modules ``module`` imports."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    known = modules()
    return {name for name in found if name in known}


def owner(module: str) -> str:
    """The layer or side package ``module`` belongs to."""
    for package in [*SIDE_PACKAGES, *reversed(LAYERS)]:
        if module == package or module.startswith(package + "."):
            return package
    return module


def allowed(importer: str, imported: str) -> bool:
    if imported.startswith("rdc_client"):
        return importer.startswith("rdc_client")
    if imported.startswith("rdc_server"):
        return not importer.startswith("rdc.") and importer != "rdc"
    if importer.startswith(("rdc_server", "rdc_client")):
        return True
    if imported in LEAVES or owner(imported) == owner(importer):
        return True
    mine, theirs = owner(importer), owner(imported)
    if mine in SIDE_PACKAGES:
        return theirs in SIDE_PACKAGES[mine]
    if mine in LAYERS and theirs in LAYERS:
        return LAYERS.index(theirs) < LAYERS.index(mine)
    return mine not in LAYERS and mine not in SIDE_PACKAGES  # the leaves themselves


def test_every_import_keeps_to_the_layers() -> None:
    wrong = []
    for module, path in sorted(modules().items()):
        for imported in sorted(imports(module, path)):
            if not allowed(module, imported):
                wrong.append(f"{module} imports {imported}")
    assert not wrong, "\n".join(wrong)


def test_the_native_layer_imports_nothing_else_from_rdc() -> None:
    for module, path in modules().items():
        if owner(module) == "rdc._native":
            outside = {m for m in imports(module, path) if not m.startswith("rdc._native")}
            assert outside <= {"rdc._native"}, f"{module} imports {outside}"


def test_no_import_cycles() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules().items():
        graph[module] = {m for m in imports(module, path) if m != module}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            # a package importing its own submodules is how a package exports them
            if node == nxt.rpartition(".")[0] or nxt == node.rpartition(".")[0]:
                continue
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_the_rules_catch_a_violation() -> None:
    assert not allowed("rdc._native.chunker_ref", "rdc.local.paths")
    assert not allowed("rdc.content.tree", "rdc.wire.codec")
    assert not allowed("rdc.transfer.client", "rdc_client.remote")
    assert not allowed("rdc_server.shares", "rdc_client.cli")
    assert not allowed("rdc.storage.s3", "rdc.content.tree")
    assert allowed("rdc.transfer.client", "rdc.local.replica")
    assert allowed("rdc_client.cli", "rdc_server.cli")
