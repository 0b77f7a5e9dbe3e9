"""The import graph of the library (files as nodes, every import statement as an edge, imports inside functions
included) has no circle and no edge from a lower layer to a higher one; no module imports another's private name.

The layer order is docs/architecture.md's: a module may import modules of its own layer or of lower layers only.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Lowest first.  The torch modules are a backend: a peer of the Numba reference below the dispatcher.
LAYERS: list[tuple[str, ...]] = [
    ("fpsim._cache", "fpsim._hashing", "fpsim._jit", "fpsim._arrays", "fpsim._simd", "fpsim._kernels",
     "fpsim.formats", "fpsim.random", "fpsim.packing", "fpsim.validate"),
    ("fpsim.codecs",),
    ("fpsim.schemes", "fpsim.conventions", "fpsim.plan", "fpsim.tensor", "fpsim._scaling_kernels",
     "fpsim._row_kernels", "fpsim._analysis_kernels"),
    ("fpsim.scaling",),
    ("fpsim._analysis_sums",),
    ("fpsim.transforms",),
    ("fpsim.gemm",),
    ("fpsim.torch",),  # the torch backend: codecs, quantize, rht, gemm, Triton kernels, container
    ("fpsim.backends", "fpsim.dispatch"),
    ("fpsim.recipe",),
    ("fpsim.io",),
    ("fpsim.roles", "fpsim.analysis", "fpsim.ranking", "fpsim.oracle", "fpsim.capture", "fpsim.testing"),
    ("fpsim_cli", "fpsim.__main__"),
]

#: Training modules of fpsim.torch sit above the backend they use: the layers on the recipe, the monitor on io.
TRAINING = {"fpsim.torch.nn": "fpsim.recipe", "fpsim.torch.qlinear": "fpsim.recipe",
            "fpsim.torch.monitoring": "fpsim.io", "fpsim.torch.probes": "fpsim.analysis",
            "fpsim.torch.probe_stats": "fpsim.analysis", "fpsim.torch.models": "fpsim.analysis",
            "fpsim.torch.model_files": "fpsim.analysis"}


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg, base in (("fpsim", ROOT / "fpsim"), ("fpsim_cli", ROOT / "cli")):
        for f in sorted(base.rglob("*.py")):
            rel = f.relative_to(base).with_suffix("")
            parts = [pkg, *rel.parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = f
    return mods


MODULES = _modules()


def _resolve(mod: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    is_pkg = MODULES[mod].name == "__init__.py"
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _target(name: str) -> str | None:
    """The module file an imported dotted name lives in (longest known prefix)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        cand = ".".join(parts[:i])
        if cand in MODULES:
            return cand
    return None


def _edges() -> dict[str, set[tuple[str, str]]]:
    """module → {(imported module, imported name or '')}, over every import statement in the file."""
    out: dict[str, set[tuple[str, str]]] = {}
    for mod, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        es = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    t = _target(a.name)
                    if t:
                        es.add((t, ""))
            elif isinstance(node, ast.ImportFrom):
                src = _resolve(mod, node)
                for a in node.names:
                    sub = _target(f"{src}.{a.name}")
                    if sub and sub != _target(src) and sub.endswith("." + a.name):
                        es.add((sub, ""))  # `from pkg import module`
                    else:
                        t = _target(src)
                        if t:
                            es.add((t, a.name))
        out[mod] = {(t, n) for t, n in es if t != mod}
    return out


EDGES = _edges()


def _layer(mod: str) -> int:
    if mod in ("fpsim", "fpsim.torch"):
        return len(LAYERS)  # package facades: they import (or lazily expose) everything below them
    if mod in TRAINING:
        return _layer(TRAINING[mod]) + 0.5
    best = None
    for i, group in enumerate(LAYERS):
        for g in group:
            if mod == g or mod.startswith(g + "."):
                if best is None or len(g) > best[1]:
                    best = (i, len(g))
    assert best is not None, f"{mod} is in no layer: add it to LAYERS in tests/test_architecture.py"
    return best[0]


def test_every_module_has_a_layer():
    for mod in MODULES:
        _layer(mod)


def test_no_import_runs_from_a_lower_layer_to_a_higher_one():
    bad = [f"{m} (layer {_layer(m)}) imports {t} (layer {_layer(t)})"
           for m, es in EDGES.items() for t, _ in es if t != "fpsim" and _layer(t) > _layer(m)]
    assert not bad, "\n".join(sorted(bad))


def test_the_import_graph_has_no_circle():
    graph = {m: {t for t, _ in es if t in MODULES} for m, es in EDGES.items()}
    # fpsim (the facade) and package __init__ files that re-export their submodules are not cycles of logic:
    # an edge into a package facade from inside it would be, so keep them all.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cyc = stack[stack.index(t):] + [t]
                pytest.fail("import circle: " + " -> ".join(cyc))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_no_module_imports_another_modules_private_name():
    bad = [f"{m} imports {n} from {t}" for m, es in EDGES.items() for t, n in es
           if n.startswith("_") and not n.startswith("__")]
    assert not bad, "\n".join(sorted(bad))


def test_reference_modules_import_no_backend():
    reference = ("fpsim.formats", "fpsim.codecs", "fpsim.schemes", "fpsim.plan", "fpsim.tensor", "fpsim.scaling",
                 "fpsim.transforms", "fpsim.gemm")
    bad = [f"{m} imports {t}" for m in reference for t, _ in EDGES[m]
           if t.startswith(("fpsim.torch", "fpsim.backends", "fpsim.dispatch"))]
    assert not bad, "\n".join(bad)


#: Library files stay readable: issue 15 asks for no file above ~600 lines and no function above ~120.
MAX_FILE_LINES, MAX_FUNCTION_LINES = 600, 120


def test_no_library_file_or_function_is_too_long():
    bad = []
    for path in MODULES.values():
        text = path.read_text()
        if text.count("\n") > MAX_FILE_LINES:
            bad.append(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
    assert not bad, "\n".join(bad)
