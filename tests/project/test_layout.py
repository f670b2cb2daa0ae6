# The house rules, read from the code with ast (no module is imported): which room each
# module lives in, which rooms each room may import (LAYERS, the table docs/architecture.md's
# map is drawn from), and what the pure core may use. An import counts wherever it is written: at
# a module's top, inside a function, and under `if TYPE_CHECKING:` too (a circle a type
# checker walks is still one a reader does).
#
#   * every import between rooms is one LAYERS allows (or one of EXCEPTIONS, each marked
#     with when it goes), and LAYERS itself has no circle: so no folder imports another
#     that imports it back;
#   * no import circles among zstalk's modules;
#   * no module reachable from the one that defines Broker imports the I/O and process
#     machinery itself (what the standard library imports internally does not count);
#   * the wiring (zstalk.broker.run) is imported only by its own modules; click and
#     subprocess only by the wiring;
#   * pyproject lists every package; docs/architecture.md's map is LAYERS, rendered;
#   * every module path a comment or docstring names exists.
from __future__ import annotations

import ast
import io
import re
import tokenize
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CODE = ("broker", "protocol", "workers")
CORE = "zstalk.broker.core.broker"
NOT_IN_THE_CORE = {"asyncio", "zmq", "aiohttp", "socket", "click", "subprocess", "threading"}
WIRING = "zstalk.broker.run"
ONLY_FOR_THE_WIRING = {"click", "subprocess"}

#: the rooms (folders of code), bottom first: each with what it holds and the rooms it may
#: import (its own modules always).  A room above another may use it; nothing below may
#: reach up.  docs/architecture.md's map is this table, rendered (`render_layers`).
LAYERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "protocol/schema": ("the vocabulary: ops and replies, the messages between actors and "
                        "their encoding, the task API's names and ranges, the task family's "
                        "typed messages (an enqueue, a call, an outcome, a task's info), the "
                        "version", ()),
    "protocol": ("ratelog.py: a line logged at most once per key per interval", ()),
    "protocol/codecs": ("sans-IO codecs: beanstalk's parser and replies, yrmcds' counter "
                        "protocol, passes, Prometheus' text format", ("protocol/schema",)),
    "protocol/network": ("listening sockets, the event loop, health probes, CURVE keys, "
                         "secret and pass-key files", ("protocol/schema", "protocol",
                                                       "protocol/codecs")),
    "protocol/links": ("a front's link to the broker: the owner's side, the in-process "
                       "mailbox, the ZeroMQ link and its handshakes, open_link",
                       ("protocol/schema", "protocol", "protocol/codecs", "protocol/network")),
    "protocol/fronts": ("the beanstalk and counter fronts on their shared base",
                        ("protocol/schema", "protocol", "protocol/codecs", "protocol/network",
                         "protocol/links")),
    "protocol/fronts/http": ("the HTTP/JSON front on aiohttp: tasks, schedules, the waiting "
                             "room, CORS, the OpenAPI document",
                             ("protocol/schema", "protocol", "protocol/codecs",
                              "protocol/network", "protocol/links", "protocol/fronts")),
    "workers": ("native worker pools, the producer Client, the cloud-task SDK, the "
                "counters' client, signing: the protocol only",
                ("protocol/schema", "protocol", "protocol/codecs", "protocol/network",
                 "protocol/links")),
    "workers/upstream": ("the dispatcher that makes cloud tasks' calls over HTTP, its "
                         "keep-alive pool per upstream, its active health checks' probes",
                         ("protocol/schema", "protocol", "protocol/codecs", "protocol/links",
                          "workers")),
    "broker/core/shared": ("what the core's components share: the out-queue, the admission "
                           "gate, bounded labels, the journal they append their records to",
                           ("protocol/schema", "protocol",
                                                    "protocol/codecs")),
    "broker/core/upstreams": ("nginx's upstream balancing, pure (spec, hashing, peer, "
                              "balance, group)", ("protocol/schema", "protocol",
                                                  "protocol/codecs", "broker/core/shared")),
    "broker/core/beanstalk": ("tubes, jobs, the queue and its timers, the beanstalk commands "
                              "and stats, native peers' checks, worker pools",
                              ("protocol/schema", "protocol", "protocol/codecs",
                               "broker/core/shared")),
    "broker/core/tasks/model": ("what a task and a function are: a task and the table of "
                                "its moves, request tasks, a function's spec, the functions, "
                                "an enqueue's options, what an outcome does (pure rules)",
                                ("protocol/schema", "protocol", "protocol/codecs",
                                 "broker/core/shared")),
    "broker/core/tasks/components": ("the task store's components, each the owner of its "
                                     "state: the lines, the waiting room, calls in flight, "
                                     "limits and the limiter, upstream calls, timers, counts",
                                     ("protocol/schema", "protocol", "protocol/codecs",
                                      "broker/core/shared", "broker/core/upstreams",
                                      "broker/core/tasks/model")),
    "broker/core/tasks": ("cloud tasks: the store, which coordinates the ledger (the only "
                          "writer of a task's status), the waiting room's flow, a restart "
                          "and the enqueue checks over the components; commands, views",
                          ("protocol/schema", "protocol", "protocol/codecs",
                           "broker/core/shared", "broker/core/upstreams",
                           "broker/core/tasks/model", "broker/core/tasks/components")),
    "broker/core/schedules": ("cron schedules: the expressions, the schedules that fire "
                              "tasks, their commands",
                              ("protocol/schema", "protocol", "protocol/codecs",
                               "broker/core/shared", "broker/core/upstreams",
                               "broker/core/tasks/model", "broker/core/tasks/components",
                               "broker/core/tasks")),
    "broker/core": ("the pure state core: broker.py routes each op to its family's component "
                    "and owns fronts and sessions; counters.py",
                    ("protocol/schema", "protocol", "protocol/codecs", "broker/core/shared",
                     "broker/core/tasks/model", "broker/core/tasks/components",
                     "broker/core/upstreams", "broker/core/beanstalk", "broker/core/tasks",
                     "broker/core/schedules")),
    "broker/wal": ("durability: the binlog, its on-disk format, fsync, beanstalkd's binlog "
                   "reader and the importer; the journal on NATS JetStream, its lease and "
                   "a takeover's fence",
                   ("protocol/schema", "protocol", "protocol/codecs", "broker/core/shared",
                    "broker/core/tasks/model", "broker/core/tasks/components",
                    "broker/core/upstreams", "broker/core/beanstalk", "broker/core/tasks",
                    "broker/core/schedules", "broker/core")),
    "broker": ("the broker actor (the core on an event loop, a ZeroMQ ROUTER, a mailbox), its "
               "config file, its metrics, and LocalBroker for tests (testing.py)",
               ("protocol/schema", "protocol", "protocol/codecs", "protocol/network",
                "protocol/links", "workers", "broker/core/shared", "broker/core/upstreams",
                "broker/core/tasks/model", "broker/core/tasks/components",
                "broker/core/beanstalk", "broker/core/tasks", "broker/core/schedules",
                "broker/core", "broker/wal")),
    "broker/run": ("the wiring: the zstalk and zstalkd commands, `zstalk serve` in one "
                   "process, the supervisor of --fronts N, front processes; nothing but "
                   "its ops/ imports it",
                   ("protocol/schema", "protocol", "protocol/codecs", "protocol/network",
                    "protocol/links", "protocol/fronts", "protocol/fronts/http", "workers",
                    "workers/upstream", "broker/core/shared", "broker/core/upstreams",
                    "broker/core/beanstalk",
                    "broker/core/tasks/model", "broker/core/tasks/components",
                    "broker/core/tasks", "broker/core/schedules", "broker/core", "broker/wal",
                    "broker")),
    "broker/run/ops": ("the operator's commands, clients of a running server: zstalk tasks, "
                       "functions and schedules, zstalk stats, zstalk top; loaded by name "
                       "only when one runs, never on serve's start path",
                       ("protocol/schema", "protocol/codecs", "broker/core", "broker/run")),
}
#: imports across the layers that are allowed for now, each (importer, imported module) with
#: when it goes
EXCEPTIONS = {
    ("zstalk.workers.testing", "zstalk.broker.testing"):
        "LocalBroker's old path, kept for 0.2 only (a DeprecationWarning says so)",
}


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


def test_only_the_wiring_imports_the_wiring(graph):
    importers = {m for m, (ours, _) in graph.items() if any(o.startswith(WIRING) for o in ours)}
    assert {m for m in importers if not m.startswith(WIRING)} == set()


def test_only_the_wiring_imports_click_and_subprocess(graph):
    users = {m: sorted(others & ONLY_FOR_THE_WIRING) for m, (_, others) in graph.items()
             if others & ONLY_FOR_THE_WIRING and not m.startswith(WIRING)}
    assert users == {}


def test_pyproject_lists_every_package_so_an_install_has_every_room():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    packages = {name for name, path in modules().items() if path.name == "__init__.py"}
    assert packages == listed



# -- the layers ---------------------------------------------------------------------------------
def room_of(module: str, path: Path) -> str:
    """The room (folder) a module lives in: its package's folder."""
    return str(path.parent.relative_to(ROOT))


def test_every_import_between_rooms_is_one_the_layers_allow(graph):
    known = modules()
    refused = []
    for name, (ours, _) in graph.items():
        room = room_of(name, known[name])
        allowed = set(LAYERS[room][1]) | {room}
        for other in ours:
            if room_of(other, known[other]) not in allowed and (name, other) not in EXCEPTIONS:
                refused.append(f"{name} ({room}) -> {other} ({room_of(other, known[other])})")
    assert refused == []


def test_each_exception_is_still_needed_and_says_when_it_goes(graph):
    """An exception whose import is gone goes from the table too."""
    for (importer, imported), when in EXCEPTIONS.items():
        assert imported in graph[importer][0], (importer, imported)
        assert when


def test_every_folder_of_code_is_a_room_of_the_table():
    assert {room_of(m, p) for m, p in modules().items()} == set(LAYERS)


def test_a_room_imports_only_rooms_listed_before_it_so_no_folders_import_each_other():
    order = list(LAYERS)
    for room, (_, below) in LAYERS.items():
        assert all(order.index(other) < order.index(room) for other in below), room


def test_the_checker_refuses_an_upward_import(tmp_path):
    """The table's check finds what it must: a front importing the broker core."""
    graph = {"zstalk.protocol.fronts.beanstalk": ({"zstalk.broker.core.broker"}, set())}
    known = modules()
    name, (ours, _) = next(iter(graph.items()))
    room = room_of(name, known[name])
    assert [o for o in ours if room_of(o, known[o]) not in set(LAYERS[room][1]) | {room}]


def render_layers() -> str:
    """LAYERS as docs/architecture.md shows it: the top room first."""
    lines = ["| room | what it holds | may import |", "|---|---|---|"]
    order = list(LAYERS)
    for room, (holds, allowed) in reversed(LAYERS.items()):
        below = order[:order.index(room)]
        not_allowed = [r for r in below if r not in allowed]
        if not allowed:
            uses = "nothing of zstalk"
        elif len(not_allowed) < len(allowed):
            uses = "every room below" + (" but " + ", ".join(f"`{r}/`" for r in not_allowed)
                                         if not_allowed else "")
        else:
            uses = ", ".join(f"`{r}/`" for r in allowed)
        lines.append(f"| `{room}/` | {holds} | {uses} |")
    return "\n".join(lines)


def test_the_architecture_page_map_is_the_table_of_layers():
    page = (ROOT / "docs" / "architecture.md").read_text()
    block = page.split("<!-- rooms -->", 1)[1].split("<!-- /rooms -->", 1)[0]
    assert block.strip() == render_layers(), "\n" + render_layers()


# -- what comments and docstrings name ----------------------------------------------------------
_PATH = re.compile(r"(?<![\w./-])((?:broker|protocol|workers|tests|scripts)/[\w./<>*-]*[\w/>*])")
_BARE = re.compile(r"(?<![\w./-<])(\w+\.py)\b")
_DOTTED = re.compile(r"(?<![\w.])(zstalk\.(?:broker|protocol|workers)(?:\.\w+)*)")


def texts(path: Path):
    """(line, text) of every comment and string of a Python file."""
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING):
            yield tok.start[0], tok.string


def top_names(path: Path) -> set[str]:
    """What a module defines or imports at its top, its `__all__` and lazy names, and for
    a package its modules and sub-packages."""
    tree, found = ast.parse(path.read_text()), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif isinstance(node, ast.alias):
            found.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)           # __all__ and _LAZY's names, __getattr__'s
    if path.name == "__init__.py":
        found |= {p.stem for p in path.parent.iterdir()}
    return found


def stale_mentions(files) -> list[str]:
    known = modules()
    every_py = {p.name for top in (*CODE, "tests", "scripts") for p in (ROOT / top).rglob("*.py")}
    stale = []
    for path in files:
        ours = path.relative_to(ROOT).parts[0] in CODE
        for line, text in texts(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            stale += [f"{where} {m}" for m in _PATH.findall(text)     # (but patterns)
                      if not (ROOT / m.rstrip(".")).exists() and not set(m) & set("*<>")]
            if ours:        # (tests write files of their own: their bare names are theirs)
                stale += [f"{where} {m}" for m in _BARE.findall(text) if m not in every_py]
            for dotted in _DOTTED.findall(text):
                parts = dotted.split(".")
                while parts and ".".join(parts) not in known:
                    parts.pop()
                rest = dotted.split(".")[len(parts):]
                if not parts or rest and rest[0] not in top_names(known[".".join(parts)]):
                    stale.append(f"{where} {dotted}")
    return stale


def test_every_module_a_comment_or_docstring_names_exists():
    files = [p for top in (*CODE, "tests", "scripts") for p in (ROOT / top).rglob("*.py")
             if "greenstalk" not in p.parts and p.name != "test_layout.py"]   # (its self-test)
    assert stale_mentions(files) == []


def test_a_mention_of_a_module_that_moved_is_found(tmp_path, monkeypatch):
    stray = ROOT / "protocol" / "_layout_selftest.py"
    stray.write_text('"""See protocol/transport/link.py and zstalk.broker.tasks."""\n'
                     "# and link.py\n")
    try:
        assert [m.split(" ", 1)[1] for m in stale_mentions([stray])] == [
            "protocol/transport/link.py", "zstalk.broker.tasks", "link.py"]
    finally:
        stray.unlink()
