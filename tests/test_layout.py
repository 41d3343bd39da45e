"""The package's rooms by lifecycle (docs/ARCHITECTURE.md, "Where a change goes"), pinned by its imports,
and the house kept easy to carry on: no import circle, few imports that run up a floor, no module or
request-path function too long to read at once.

Every import is read from the source (module level, inside functions and under ``if TYPE_CHECKING``
alike), so neither a lazy import nor a type-only one can hide an arrow.
"""

from __future__ import annotations

import ast
import itertools
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "service" / "keyrank"
PREPARE_TIME = ("keyrank.prepare",)
OFFLINE_TOOLS = ("keyrank.training", "keyrank.evaluation", "keyrank.bench")
# The judged data, its splits and the constructions over the public data sets: below every offline tool, so
# training keeps off exactly the topics and meetings evaluation reports on without either importing the other.
JUDGED_DATA = ("keyrank.data",)
OFFLINE = OFFLINE_TOOLS + JUDGED_DATA
MODEL_SERVER = ("keyrank.modelserver",)
# The request path may start or reach the model server only through these doors (lazily, on demand).
MODEL_SERVER_DOORS = {
    "keyrank.reranker": {"keyrank.modelserver.embedded"},  # Reranker.embedded()
    "keyrank.scoring.pytorch": {"keyrank.modelserver.python_models.torch_encoder"},  # the GPU model code, shared
}
# Prepare-time code writes what the model server serves, so it reads the server's side of that contract
# (the model's name, its tensors, the Python-backend code copied beside the weights), and nothing else of it.
PREPARE_TIME_DOORS = {"keyrank.modelserver.repository"}
FRONT_DOOR = "keyrank.cli"  # dispatches every command, so it may import every room


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    module = _module_name(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".")[: -node.level] if path.name != "__init__.py" else module.split(".")[: len(module.split(".")) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in found if m.startswith("keyrank")}


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = {m for m in _imports(path) if m in modules and m != name}
    return graph


def _room(module: str, rooms: tuple[str, ...]) -> bool:
    return any(module == r or module.startswith(r + ".") for r in rooms)


def _request_path(module: str) -> bool:
    return module != FRONT_DOOR and not _room(module, PREPARE_TIME + OFFLINE + MODEL_SERVER)


def _dependencies() -> dict[str, set[str]]:
    """The import graph without the edges into a module's own enclosing packages: a package's __init__ is entered
    by every import below it, so such an edge is no dependency."""
    graph = _graph()
    return {m: {d for d in deps if not (d in graph and m.startswith(d + "."))} for m, deps in graph.items()}


def _tied(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected parts of ``edges`` with more than one node: the nodes that import each other in a loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = set()
            while True:
                top = stack.pop()
                part.add(top)
                if top == node:
                    break
            if len(part) > 1:
                found.append(part)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


KNOWN_CIRCLES: dict[frozenset[str], str] = {}
"""Import circles still standing, each with why; the test fails on any other, and on one of these gone (so its
entry is dropped)."""


def test_the_package_has_no_import_circle():
    circles = {frozenset(part) for part in _tied(_dependencies())}
    assert circles == set(KNOWN_CIRCLES), sorted(sorted(c) for c in circles)


# --- floors: the fewest imports that must run up, whatever order the rooms are stacked in -------------------

MOST_ARROWS_UP = 5
"""Imports from a module to one on a higher floor, at most (issue 56: 17 before, closed by type-only imports)."""
LARGEST_KNOT = 14
"""Most rooms one loop of room-to-room imports may tie together: past it the floors cannot be worked out exactly
here, and the house is too knotted to read anyway."""


def _room_of(module: str) -> str:
    """A module's room, as docs/ARCHITECTURE.md draws them: a top-level module of the package, or a top-level folder."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _room_arrows() -> Counter:
    """(room, room) -> how many module-to-module imports run between them (the package's own __init__ is no room)."""
    arrows: Counter = Counter()
    for module, deps in _dependencies().items():
        for dep in deps:
            a, b = _room_of(module), _room_of(dep)
            if a != b and dep != "keyrank":
                arrows[a, b] += 1
    return arrows


def _fewest_up(rooms: list[str], arrows: Counter) -> tuple[int, list[str]]:
    """The order of ``rooms`` from the ground up that leaves the fewest imports running up a floor, and that number
    (exact: every subset of rooms placed below the rest, the cheapest way)."""
    best: dict[int, tuple[int, list[str]]] = {0: (0, [])}
    for size in range(len(rooms)):
        for placed in itertools.combinations(range(len(rooms)), size):
            mask = sum(1 << i for i in placed)
            cost, order = best[mask]
            for j, room in enumerate(rooms):
                if mask >> j & 1:
                    continue
                up = cost + sum(arrows[below, room] for below in order)  # placed above every room placed so far
                if (mask | 1 << j) not in best or up < best[mask | 1 << j][0]:
                    best[mask | 1 << j] = (up, order + [room])
    return best[(1 << len(rooms)) - 1]


def _arrows_up() -> list[tuple[str, str]]:
    """The imports that run up a floor when the rooms are stacked to make them fewest: within each knot of rooms
    (rooms that import each other in a loop; between knots every arrow runs down)."""
    arrows = _room_arrows()
    graph: dict[str, set[str]] = {}
    for a, b in arrows:
        graph.setdefault(a, set()).add(b)
    up = []
    for knot in _tied(graph):
        assert len(knot) <= LARGEST_KNOT, f"{len(knot)} rooms import each other in a loop: {sorted(knot)}"
        _, order = _fewest_up(sorted(knot), arrows)
        floor = {room: i for i, room in enumerate(order)}
        up += [(m, d) for m, deps in _dependencies().items() for d in deps
               if _room_of(m) in floor and _room_of(d) in floor and floor[_room_of(d)] > floor[_room_of(m)]]
    return sorted(up)


def test_at_most_five_imports_run_up_a_floor():
    up = _arrows_up()
    assert len(up) <= MOST_ARROWS_UP, up


def test_the_floor_count_sees_an_import_that_runs_up():
    arrows = Counter({("config", "scoring"): 1, ("strategies", "config"): 3, ("config", "strategies"): 1})
    assert _fewest_up(["config", "scoring", "strategies"], arrows) == (1, ["scoring", "config", "strategies"])


# --- sizes: a module read whole, a request-path function read at once ------------------------------------------

MOST_MODULE_LINES = 400
LONG_MODULES: dict[str, str] = {}
"""Modules allowed past ``MOST_MODULE_LINES``, each with why."""
MOST_FUNCTION_LINES = 60
LONG_FUNCTIONS = {
}
"""Request-path functions allowed past ``MOST_FUNCTION_LINES`` (definition to last line), each with why."""


def test_no_module_is_longer_than_a_reader_holds():
    modules = {_module_name(p): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    long = {m for m, lines in modules.items() if lines > MOST_MODULE_LINES}
    assert long == set(LONG_MODULES), {m: modules[m] for m in long ^ set(LONG_MODULES) if m in modules}


def _functions(path: Path):
    """(qualified name, lines) of every function and method in ``path``, nested ones included."""
    def walk(node: ast.AST, prefix: str):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}.{child.name}"
                if not isinstance(child, ast.ClassDef):
                    yield name, child.end_lineno - child.lineno + 1
                yield from walk(child, name)
            else:
                yield from walk(child, prefix)

    yield from walk(ast.parse(path.read_text()), _module_name(path))


def test_no_request_path_function_is_longer_than_a_screen():
    lines = {name: n for p in PACKAGE.rglob("*.py") if _request_path(_module_name(p)) for name, n in _functions(p)}
    long = {name for name, n in lines.items() if n > MOST_FUNCTION_LINES}
    assert long == set(LONG_FUNCTIONS), {name: lines.get(name) for name in long ^ set(LONG_FUNCTIONS)}


def test_the_request_path_never_imports_prepare_time_or_offline_code():
    arrows = sorted((m, d) for m, deps in _graph().items() if _request_path(m)
                    for d in deps if _room(d, PREPARE_TIME + OFFLINE))
    assert arrows == []


def test_the_request_path_reaches_the_model_server_only_through_its_doors():
    arrows = sorted((m, d) for m, deps in _graph().items() if _request_path(m)
                    for d in deps if _room(d, MODEL_SERVER) and d not in MODEL_SERVER_DOORS.get(m, set()))
    assert arrows == []


def test_prepare_time_code_never_imports_offline_tools_and_reaches_the_model_server_only_for_its_contract():
    # The judged data is allowed: the CPU variants' gate and the int8 calibration read real pairs, and the
    # calibration must keep to the training split (data/splits.py), as training does.
    arrows = sorted((m, d) for m, deps in _graph().items() if _room(m, PREPARE_TIME)
                    for d in deps if _room(d, OFFLINE_TOOLS) or (_room(d, MODEL_SERVER) and d not in PREPARE_TIME_DOORS))
    assert arrows == []


def test_the_model_server_never_imports_prepare_time_or_offline_code():
    # What runs beside the service must not need the export extra (PyTorch, transformers) or a tool.
    arrows = sorted((m, d) for m, deps in _graph().items() if _room(m, MODEL_SERVER)
                    for d in deps if _room(d, PREPARE_TIME + OFFLINE))
    assert arrows == []


def test_the_offline_tools_never_import_one_another():
    arrows = sorted((m, d) for m, deps in _graph().items() for room in OFFLINE_TOOLS if _room(m, (room,))
                    for d in deps if _room(d, OFFLINE_TOOLS) and not _room(d, (room,)))
    assert arrows == []


def test_the_judged_data_imports_no_offline_tool():
    arrows = sorted((m, d) for m, deps in _graph().items() if _room(m, JUDGED_DATA)
                    for d in deps if _room(d, OFFLINE_TOOLS))
    assert arrows == []


def test_no_module_imports_another_modules_private_names():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("keyrank"):
                offenders += [f"{_module_name(path)}: {node.module}.{a.name}" for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
    assert offenders == []
