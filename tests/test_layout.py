"""The package's rooms by lifecycle (docs/ARCHITECTURE.md, "Where a change goes"), pinned by its imports.

Every import is read from the source (module level and inside functions alike,
``if TYPE_CHECKING`` blocks excepted), so a lazy import cannot hide an arrow.
"""

from __future__ import annotations

import ast
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
    hidden: set[int] = set()
    for node in ast.walk(tree):  # skip `if TYPE_CHECKING:` bodies
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(n) for child in node.body for n in ast.walk(child))
    found: set[str] = set()
    module = _module_name(path)
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
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


def test_the_package_has_no_import_circle():
    graph = _graph()
    # Package __init__ modules are entered by every import below them; an edge into one is not a dependency.
    edges = {m: {d for d in deps if not (d in graph and m.startswith(d + "."))} for m, deps in graph.items()}
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                circles.append(trail[trail.index(nxt):] + [node, nxt] if nxt in trail else [node, nxt])
            elif nxt not in state:
                visit(nxt, trail + [node])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [])
    assert circles == []


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
