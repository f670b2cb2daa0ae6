# The house rules, read from the code with ast (no module is imported): which room each
# module lives in, which way the arrows between modules point, and what the pure core may
# use. An import counts wherever it is written: at a module's top, inside a function, and
# under `if TYPE_CHECKING:` too (a circle a type checker walks is still one a reader does).
#
#   * no import circles among zstalk's modules;
#   * no module reachable from the one that defines Broker imports the I/O and process
#     machinery itself (what the standard library imports internally does not count);
#   * the wiring (zstalk.broker.run) is imported only by its own modules and the
#     `python -m zstalk.broker.cli` shim; click and subprocess only by the wiring;
#   * a room (a folder of code) holds at most 15 modules, and pyproject lists every one.
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CODE = ("broker", "protocol", "workers")
CORE = "zstalk.broker.core.broker"
NOT_IN_THE_CORE = {"asyncio", "zmq", "aiohttp", "socket", "click", "subprocess", "threading"}
WIRING = "zstalk.broker.run"
SHIM = "zstalk.broker.cli"
ONLY_FOR_THE_WIRING = {"click", "subprocess"}
ROOM_MAX = 15


def modules() -> dict[str, Path]:
    """Every zstalk module by its dotted name (a package by its __init__)."""
    found = {}
    for top in CODE:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(("zstalk",) + parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(zstalk modules, other top-level modules) that `name` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    ours, others = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                _sort(alias.name, ours, others, known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                _sort(full if full in known else base, ours, others, known)
    return ours, others


def _sort(module: str, ours: set, others: set, known: dict) -> None:
    if module.startswith("zstalk"):
        while module not in known and "." in module:
            module = module.rpartition(".")[0]
        ours.add(module)
    else:
        others.add(module.partition(".")[0])


@pytest.fixture(scope="module")
def graph() -> dict[str, tuple[set[str], set[str]]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), and modules
    that import themselves."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1 or v in edges.get(v, ()):
                found.append(sorted(part))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for w in edges.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_no_zstalk_modules_import_each_other_in_a_circle(graph):
    assert circles({m: ours for m, (ours, _) in graph.items()}) == []


def test_the_circle_finder_finds_a_circle_of_three():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_imports_in_a_function_and_under_type_checking_count(tmp_path):
    module = tmp_path / "pool.py"
    module.write_text("from typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n    from .worker import Worker\n"
                      "def run():\n    from . import job\n")
    known = {name: tmp_path / "x.py" for name in
             ("zstalk.workers.pool", "zstalk.workers.worker", "zstalk.workers.job")}
    ours, others = imports("zstalk.workers.pool", module, known)
    assert ours == {"zstalk.workers.worker", "zstalk.workers.job"} and others == {"typing"}


def test_nothing_the_broker_core_reaches_imports_sockets_event_loops_or_processes(graph):
    edges = {m: ours for m, (ours, _) in graph.items()}
    offending = {m: sorted(others & NOT_IN_THE_CORE)
                 for m in reachable(edges, CORE) for others in [graph[m][1]]
                 if others & NOT_IN_THE_CORE}
    assert offending == {}


def test_the_core_reaches_its_families_and_not_the_actor_or_the_fronts(graph):
    reached = reachable({m: ours for m, (ours, _) in graph.items()}, CORE)
    assert {"zstalk.broker.core.beanstalk.commands", "zstalk.broker.core.counters",
            "zstalk.broker.core.tasks.commands"} <= reached
    assert not [m for m in reached if m.startswith(("zstalk.broker.actor", "zstalk.broker.wal.binlog",
                                                     "zstalk.protocol.fronts", "zstalk.protocol.network",
                                                     "zstalk.workers", WIRING))]


def test_only_the_wiring_and_the_shim_import_the_wiring(graph):
    importers = {m for m, (ours, _) in graph.items() if any(o.startswith(WIRING) for o in ours)}
    assert {m for m in importers if not m.startswith(WIRING)} == {SHIM}


def test_only_the_wiring_imports_click_and_subprocess(graph):
    users = {m: sorted(others & ONLY_FOR_THE_WIRING) for m, (_, others) in graph.items()
             if others & ONLY_FOR_THE_WIRING and not m.startswith(WIRING)}
    assert users == {}


def test_every_room_holds_at_most_fifteen_modules():
    rooms = {}
    for path in modules().values():
        if path.name not in ("__init__.py", "__main__.py"):
            rooms.setdefault(str(path.parent.relative_to(ROOT)), []).append(path.stem)
    assert {room: len(names) for room, names in rooms.items() if len(names) > ROOM_MAX} == {}


def test_pyproject_lists_every_package_so_an_install_has_every_room():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    packages = {name for name, path in modules().items() if path.name == "__init__.py"}
    assert packages == listed


def test_the_readme_map_names_every_room_and_no_other():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- rooms -->", 1)[1].split("<!-- /rooms -->", 1)[0]
    named = {line.split()[0].rstrip("/") for line in block.splitlines()
             if line[:1].isalpha() and "/" in line.split()[0]}
    rooms = {str(path.parent.relative_to(ROOT)) for path in modules().values()}
    assert named == rooms
