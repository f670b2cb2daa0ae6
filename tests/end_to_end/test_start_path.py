# The start path: what `zstalkd` and `zstalk serve` load before they answer their first
# command, read from Python's own import log (-X importtime, through the environment),
# and the bytecode the set-up scripts leave behind.
#
# A tool that spawns a beanstalkd per test gives it about 0.1 s (greenstalk's and pystalk's
# fixtures), so the start path imports only what it serves: ZeroMQ with a worker endpoint,
# aiohttp with an HTTP port, the config reader with --config, cron with schedules, msgpack
# once something is encoded. How long it takes is scripts/bench_beanstalk.py's row 7,
# side by side with beanstalkd; no timing is asserted here.
from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from servers import LOOPBACK, connect, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: loaded on demand only: by an HTTP port, a worker endpoint, a config file, schedules,
#: and the first message encoded for another process or the first task record
ON_DEMAND = ("aiohttp", "zmq", "tomllib", "zstalk.broker.config_file", "zstalk.broker.core.schedules.cron",
             "zstalk.workers", "zstalk.workers.upstream.dispatcher", "msgpack", "ssl_from_zstalk",
             "nats", "zstalk.broker.wal.stream", "zstalk.broker.wal.jetstream",
             # the operator's commands (`zstalk tasks`, `zstalk stats`, ...): never by serve
             "zstalk.broker.run.ops.operator", "zstalk.broker.run.ops.stats",
             "zstalk.broker.run.ops.top")
_LINE = re.compile(r"import time:\s+\d+ \|\s+\d+ \|( *)(\S+)")


def imports_before_first_reply(command: list[str], then: str = "") -> list[tuple[int, str]]:
    """(depth, module) for every module `command` imported, in Python's order (a child is
    listed before the module that imported it), until it answered a put on its port (and
    then, if given, said a line starting with `then`: its start line)."""
    env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1")
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        port = int(command[command.index("-p") + 1])
        assert wait_for(lambda: _put(port), 10), f"{command[0]} never answered a put"
        if then:
            assert wait_for(lambda: any(line.startswith(then) for line in lines), 10), \
                f"{command[0]} never said {then!r}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
        reader.join(10)
    return [(len(m.group(1)), m.group(2)) for m in map(_LINE.match, lines) if m]


def _put(port: int) -> bool:
    with connect((LOOPBACK, port), 2) as sock:
        sock.sendall(b"put 0 0 60 1\r\nx\r\n")
        return sock.recv(100).startswith(b"INSERTED")


def importer(imports: list[tuple[int, str]], name: str) -> str | None:
    """The module whose import first loaded `name` (the next one listed less deep)."""
    for i, (depth, module) in enumerate(imports):
        if module == name:
            return next((m for d, m in imports[i + 1:] if d < depth), None)
    return None


def on_demand_loaded(imports: list[tuple[int, str]]) -> list[str]:
    names = {m for _, m in imports}
    loaded = [m for m in ON_DEMAND if m in names]
    # asyncio imports ssl itself; only a zstalk module importing it would be ours
    if (importer(imports, "ssl") or "").startswith("zstalk"):
        loaded.append("ssl_from_zstalk")
    return loaded


def test_zstalkd_answers_its_first_command_having_loaded_nothing_it_does_not_serve():
    imports = imports_before_first_reply([str(BIN / "zstalkd"), "-l", LOOPBACK,
                                          "-p", str(free_port())])
    assert {"zstalk.broker.core.broker", "uvloop"} <= {m for _, m in imports}   # the log is whole
    assert on_demand_loaded(imports) == []
    assert "click" not in {m for _, m in imports}, \
        f"zstalkd loads click (~13 ms), through {importer(imports, 'click')}"
    # what only a config's upstreams and the task family's rarer paths use
    rare = [m for _, m in imports if m in ("zstalk.broker.core.upstreams.group",
                                           "dataclasses", "ipaddress", "urllib.parse")]
    assert rare == [], f"{rare[0]} through {importer(imports, rare[0])}"


def test_zstalkd_loads_the_task_family_after_its_first_answer_on_the_loading_thread():
    # a tenth of the start-up: serve.py's load_on_a_thread imports it (no module does)
    # once the front answers, then the broker builds it; -V's start line says the
    # start-up is over
    imports = imports_before_first_reply([str(BIN / "zstalkd"), "-V", "-l", LOOPBACK,
                                          "-p", str(free_port())], then="zstalkd ")
    order = [m for _, m in imports]
    front = order.index("zstalk.protocol.fronts.beanstalk")    # (started after the broker)
    for family in ("zstalk.broker.core.tasks.commands", "zstalk.broker.core.schedules.commands"):
        assert order.index(family) > front, f"{family} loads before the front answers"
        assert importer(imports, family) is None, f"{family} through {importer(imports, family)}"


def test_zstalk_serve_without_a_worker_endpoint_loads_no_zeromq():
    imports = imports_before_first_reply([str(BIN / "zstalk"), "serve", "-l", LOOPBACK,
                                          "-p", str(free_port()), "--counter-port", "0",
                                          "--worker-bind", "none"])
    assert on_demand_loaded(imports) == []


def test_a_worker_endpoint_loads_zeromq_and_nothing_else_on_demand():
    # the other half of the test above: the import log does show what an option loads
    imports = imports_before_first_reply([str(BIN / "zstalk"), "serve", "-l", LOOPBACK,
                                          "-p", str(free_port()), "--counter-port", "0",
                                          "--worker-bind", f"tcp://{LOOPBACK}:{free_port()}"])
    assert on_demand_loaded(imports) == ["zmq"]


def test_zstalkd_with_a_binlog_loads_none_of_the_nats_journal(tmp_path):
    imports = imports_before_first_reply([str(BIN / "zstalkd"), "-l", LOOPBACK, "-p",
                                          str(free_port()), "-b", str(tmp_path / "wal")])
    assert "zstalk.broker.wal.binlog" in {m for _, m in imports}     # (the log is whole)
    nats = ("nats", "zstalk.broker.wal.stream", "zstalk.broker.wal.jetstream",
            "urllib.request")           # (urllib.request: ~10 ms, for --journal-monitor)
    loaded = [m for _, m in imports if m in nats]
    assert loaded == [], f"{loaded[0]} through {importer(imports, loaded[0])}"


def test_the_importer_of_a_module_is_the_next_one_listed_less_deep():
    imports = [(3, "ssl"), (2, "asyncio.base_events"), (1, "asyncio"), (0, "zstalk.x")]
    assert importer(imports, "ssl") == "asyncio.base_events"
    assert importer(imports, "asyncio") == "zstalk.x"
    assert importer(imports, "nothing") is None


def test_scripts_zstalk_leaves_every_zstalk_module_byte_compiled():
    # scripts/zstalk makes or refreshes .venv (scripts/_venv.sh) before it runs the command
    done = subprocess.run(["bash", str(ROOT / "scripts" / "zstalk"), "--version"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    import zstalk.broker
    tree = Path(zstalk.broker.__file__).parent.parent
    sources = sorted(tree.rglob("*.py"))
    assert len(sources) > 50
    stale = [str(p.relative_to(tree)) for p in sources if not _compiled(p)]
    assert stale == []


def _compiled(source: Path) -> bool:
    """Whether `source` has bytecode Python will use as it is (its header records the
    source's mtime and size: PEP 552's timestamp form)."""
    cached = Path(importlib.util.cache_from_source(str(source)))
    try:
        header = cached.read_bytes()[:16]
    except FileNotFoundError:
        return False
    st = source.stat()
    return (header[:4] == importlib.util.MAGIC_NUMBER and header[4:8] == bytes(4)
            and int.from_bytes(header[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
            and int.from_bytes(header[12:16], "little") == st.st_size & 0xFFFFFFFF)



def test_the_loop_goes_on_turning_while_the_rest_of_the_start_up_loads(tmp_path, monkeypatch):
    """What `zstalk serve` starts after its first turns (the counter front, ZeroMQ, aiohttp)
    is imported on a thread: a module that takes 0.3 s to load stops the loop for none of
    it (imported on the loop, it would turn 0 times meanwhile)."""
    import asyncio
    from zstalk.broker.run.serve import load_on_a_thread
    (tmp_path / "slow_to_load.py").write_text("import time\ntime.sleep(0.3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    interval = sys.getswitchinterval()

    async def main() -> int:
        turns = 0

        async def count() -> None:
            nonlocal turns
            while True:
                await asyncio.sleep(0.01)
                turns += 1
        counting = asyncio.ensure_future(count())
        await asyncio.sleep(0)
        await load_on_a_thread(["slow_to_load"])
        counting.cancel()
        return turns

    assert asyncio.run(main()) >= 5
    assert "slow_to_load" in sys.modules and sys.getswitchinterval() == interval
