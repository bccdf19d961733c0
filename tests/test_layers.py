"""The layer rule of docs/architecture.md#layers, checked on the source: every import inside ``largeprompt`` goes to
its own layer or one above it in the list, plot modules read only ``io`` (they draw, they compute nothing), and no
two modules import each other through any chain (imports inside functions count: a lazy import still ties them)."""
import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "largeprompt"
# docs/architecture.md#layers, top to bottom; the application layer (bench, the command line, the report) is last
LAYERS = ["core", "kernel", "io", "maths", "icl", "ledger", "stages", "plots", "app"]
APP = {"bench", "commands", "__init__"}
PLOTS_READ = {"core", "io", "plots"}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    return "app" if top in APP else top


def imports(path: Path, known: set[str]) -> set[str]:
    """The ``largeprompt`` modules ``path`` imports anywhere in its body (``from a import b`` counts a.b if a module)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        out |= {n for n in names if n in known}
    return out


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in SRC.rglob("*.py")}
    known = set(paths)
    graph = {}
    for module, path in paths.items():
        # a package's __init__ is not an edge from its own submodules (importing a.b runs a/__init__ first)
        graph[module] = {t for t in imports(path, known) if t != module and not module.startswith(t + ".")}
    return graph


def violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, targets in graph.items():
        own = layer(module)
        for target in targets:
            other = layer(target)
            if LAYERS.index(other) > LAYERS.index(own):
                out.append(f"{module} ({own}) imports {target} ({other}), a layer below it")
            elif own == "plots" and other not in PLOTS_READ:
                out.append(f"{module} (plots) imports {target} ({other}): plots read tables through io only")
    return sorted(out)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_import_goes_up_the_layers():
    graph = import_graph()
    assert "largeprompt.io.parquet_io" in graph["largeprompt.stages.train"]  # the graph sees real imports
    assert violations(graph) == []


def test_there_is_no_import_cycle():
    assert cycles(import_graph()) == []


@pytest.mark.parametrize("graph, bad", [
    ({"largeprompt.maths.a": {"largeprompt.icl.b"}, "largeprompt.icl.b": set()}, "a layer below it"),
    ({"largeprompt.plots.a": {"largeprompt.icl.b"}, "largeprompt.icl.b": set()}, "plots read tables through io only"),
    ({"largeprompt.core.a": {"largeprompt.bench.b"}, "largeprompt.bench.b": set()}, "a layer below it"),
])
def test_an_upward_import_is_caught(graph, bad):
    found = violations(graph)
    assert len(found) == 1 and bad in found[0]


def test_a_cycle_is_caught():
    graph = {"largeprompt.icl.a": {"largeprompt.icl.b"}, "largeprompt.icl.b": {"largeprompt.icl.c"},
             "largeprompt.icl.c": {"largeprompt.icl.a"}, "largeprompt.icl.d": {"largeprompt.icl.a"}}
    assert cycles(graph) == [["largeprompt.icl.a", "largeprompt.icl.b", "largeprompt.icl.c"]]


# the training engine's rooms (src/largeprompt/icl/engine/__init__.py), each importing only those before it
ENGINE = ["native_step", "stacked", "tuning", "runs", "loop", "protocol", "status", "run_log", "job"]


def engine_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports between the engine's rooms that go to a room listed after the importer (or to one not listed)."""
    prefix, out = "largeprompt.icl.engine.", []
    for module, targets in graph.items():
        if not module.startswith(prefix):
            continue
        own = module[len(prefix):].split(".")[0]
        for target in targets:
            if target.startswith(prefix):
                other = target[len(prefix):].split(".")[0]
                if own not in ENGINE or other not in ENGINE or ENGINE.index(other) >= ENGINE.index(own):
                    out.append(f"{module} imports {target}: not a room listed before it")
    return out


def test_the_engine_rooms_import_in_their_order():
    graph = import_graph()
    rooms = {m.rsplit(".", 1)[-1] for m in graph if m.startswith("largeprompt.icl.engine.")}
    assert rooms == set(ENGINE), rooms ^ set(ENGINE)  # every room is listed, and only rooms
    assert engine_violations(graph) == []
    assert engine_violations({"largeprompt.icl.engine.stacked": {"largeprompt.icl.engine.loop"}})  # the rule can fail


def test_c_sources_include_only_system_headers_and_are_built_by_a_module_beside_them():
    """Native code: a .c or .h file includes only system headers (the shared vector_math.h is put in front of each
    source by largeprompt.kernel.native_build, never included), and every .c file is named by a ``*_SOURCE``
    constant of a module in its own folder (so its text is fingerprinted, docs/architecture.md#fingerprints)."""
    import re

    sources = sorted(SRC.rglob("*.c")) + sorted(SRC.rglob("*.h"))
    assert sources
    for path in sources:
        for include in re.findall(r'^\s*#\s*include\s+(\S+)', path.read_text(), flags=re.M):
            assert include.startswith("<") and include.endswith(">"), f"{path.name} includes {include}"
    for path in SRC.rglob("*.c"):
        named = [m for m in path.parent.glob("*.py") if re.search(rf'_SOURCE\s*=\s*"{re.escape(path.name)}"', m.read_text())]
        assert named, f"{path.relative_to(SRC)} is named by no *_SOURCE constant beside it"
