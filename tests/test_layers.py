"""The package's layers, read from the source: no import circle anywhere, no import from a layer above, and no
module past 400 lines. Module-level and function-level imports count alike (docs/ARCHITECTURE.md)."""
import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "gpulab"
LAYERS = ("measuring", "verdicts", "tools", "workloads", "display", "lessons", "app")  # bottom to top
TOP = {"gpulab", "gpulab.__main__", "gpulab._rank", "gpulab._moved"}  # facade, CLI, a rank's entry, old tool paths


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the gpulab modules it imports anywhere in its source (relative and absolute)."""
    mods = _modules()

    def known(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
                if base.split(".")[0] == "gpulab":
                    edges |= {known(f"{base}.{a.name}") if f"{base}.{a.name}" in mods else known(base)
                              for a in node.names}
            elif isinstance(node, ast.Import):
                edges |= {known(a.name) for a in node.names if a.name.split(".")[0] == "gpulab"}
        graph[mod] = edges - {mod, ""}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_the_graph_sees_relative_absolute_and_function_level_imports():
    graph = import_graph()
    assert "gpulab.measuring.device" in graph["gpulab.measuring.peaks"]  # relative, module level
    assert "gpulab.display.plots" in graph["gpulab"]  # inside a function
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle():
    found = cycles(import_graph())
    assert not found, "import circles (move what both sides need below both): " + "; ".join(
        " <-> ".join(c) for c in found)


def test_every_module_lives_in_a_layer():
    loose = sorted(m for m in _modules() if layer_of(m) is None and m not in TOP
                   and m.removeprefix("gpulab.") not in LAYERS)
    assert not loose, f"put these in a layer folder ({', '.join(LAYERS)}): {loose}"


def test_no_upward_import():
    graph = import_graph()
    up = sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                if layer_of(m) is not None and (layer_of(t) is None and t not in {"gpulab." + x for x in LAYERS}
                                                 or (layer_of(t) or 0) > layer_of(m)))
    assert not up, f"a layer imports only the layers below it ({' < '.join(LAYERS)}): {up}"


def test_no_module_over_400_lines():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"split these by concern: {long}"


def test_old_tool_paths_warn_and_work():
    code = ("import warnings; warnings.simplefilter('error')\ntry:\n    import gpulab.batchsize\n"
            "except DeprecationWarning as w:\n    print(w)\nwarnings.simplefilter('ignore')\n"
            "import gpulab.batchsize, gpulab.tools.batchsize\nprint(gpulab.batchsize is gpulab.tools.batchsize)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         cwd=PKG.parent).stdout.splitlines()
    assert "moved to gpulab.tools.batchsize" in out[0] and out[1] == "True"
    assert not (PKG / "batchsize.py").exists()  # no file at the old path: git follows the module's rename


def test_old_module_paths_are_gone():
    """`gpulab.matmul_lab` (an older rename) and the core's flat paths no longer import."""
    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]; "
            "import importlib\nfor m in ('matmul_lab', 'device', 'claims'):\n    try:\n"
            "        importlib.import_module('gpulab.' + m)\n    except ModuleNotFoundError:\n        print('gone')")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         cwd=PKG.parent).stdout
    assert out.split() == ["gone"] * 3
