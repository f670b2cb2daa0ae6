"""Every benchmark runs, so none can rot: each scripts/bench_*.py in its --smoke mode (the
smallest counts that still run every row, seconds each), as a subprocess of the project's
python, writing --json; the JSON must parse and hold each of the benchmark's rows with a
figure for zstalk.  Then the harness's own promises: --against HEAD runs a second tree's
zstalk beside this one (built once into ~/.cache/zstalk-bench and cached by commit;
skipped, with the reason, when git or pip cannot build it), scripts/bench_readme rewrites
a block of docs/performance.md from a run, and a benchmark started with the system's python3 re-execs
itself under the project's .venv.  The whole file took about a minute and a
half before bench_limits, whose smoke adds half a minute; bench_upstreams' adds 13 s,
bench_room's 17 s (24 with part 4's launch of event streams), bench_groups' 10 s,
bench_journal's (two NATS clusters started) 3-5 s, bench_failover's (a NATS cluster, two
instances, one kill of each kind, one of them a NATS node's) about 20 s."""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nats_cluster import needs_nats_server
from servers import needs_group, self_check

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
RUN_CAP_S = 240

pytestmark = [pytest.mark.reference,
              pytest.mark.skipif(self_check(), reason="the benchmarks measure zstalk itself")]

# benchmark -> [(table, column, a piece of each row's metric that must have a figure there)]
ROWS = {
    "bench_beanstalk": [("beanstalk", "zstalk", [
        "pipelined put, 1 conn", "pipelined put, 8 conn", "pipelined put, 50 conn",
        "32 in flight, 8 conn: put", "32 in flight, 8 conn: reserve+delete",
        "1 in flight, 50 conn", "worker cycle, 1 conn", "worker cycle, 50 conn",
        "one at a time, 1 conn: put", "one at a time, 1 conn: reserve+delete",
        "put round trip, idle, p50 (ms), zstalk --fronts 1", "put round trip, under a",
        "RSS idle", "RSS with", "reserve+delete, watch 1000, jobs spread",
        "reserve cost 1000/1 tubes, jobs in 1", "delay 1s lateness p99", "TTR 1s lateness p99",
        "exec → first INSERTED, `zstalkd`", "exec → first INSERTED, `zstalk serve`",
        "server CPU-s per 1,000 puts", "batches of 32, 8 conn: put",
        "batches of 32, 8 conn: reserve+delete", "greenstalk as the client (puts/s)",
        "greenstalk as the client (cycles/s)", "floor, 1 conn put", "floor, 1 conn reserve",
        "floor, 50 conn reserve", "1 conn put: zstalk / the floor"]),
        ("beanstalk", "beanstalkd", [
            "generator ceiling, 1 conn put", "generator ceiling, 1 conn reserve+delete",
            "generator ceiling, 50 conn reserve+delete", "one at a time, 1 conn: put"])],
    "bench_binlog": [("binlog", "zstalk", [
        "pipelined put, -f 50, 1 conn", "pipelined put, -f 0, 8 conn", "recovery of 2,000 jobs",
        "server CPU-s per 1,000 puts"])],
    "bench_journal": [("journal", "zstalk journal R3", [
        "pipelined put, 8 conn x 32 in flight (puts/s)",
        "broker CPU-µs per put, journal − binlog", "put → INSERTED p99 (ms)",
        "NATS stream leader CPU-µs", "NATS follower (other) CPU-µs",
        "3 NATS servers together CPU-µs", "generator CPU-µs", "one at a time, 1 conn: put p50",
        "put p99 (ms)"]),
        ("journal", "zstalk binlog -f 0", [
            "pipelined put, 8 conn x 32 in flight (puts/s)", "broker CPU-µs per put",
            "put → INSERTED p99 (ms)", "one at a time, 1 conn: put p50", "put p99 (ms)"])],
    "bench_failover": [("failover", "zstalk", [
        "kill -9 of the leader → first acknowledged put on the survivor",
        "kill -9 of the leader: max", "and its NATS stream leader → first acknowledged put",
        "with its NATS stream leader: max", "rolling restart (SIGTERM of the leader)",
        "pause in answers", "acknowledged puts lost, each event's producer",
        "acknowledged jobs lost at the end", "acknowledged tasks lost at the end",
        "jobs restored by each new leader"])],
    "bench_counter": [("counter", "zstalk", [
        "1 connection, one at a time", "1 connection pipelined", "8 connections pipelined",
        "server CPU-s per 1,000 pairs", "floor: the minimal client", "zstalk / the floor"]),
        ("counter", "yrmcds", ["1 connection, one at a time", "generator ceiling"])],
    "bench_curve": [("curve", "zstalk CURVE on", [
        "put round trip through a remote front, idle, p50", "pipelined put through a remote",
        "1 producer + 4 worker processes", "broker CPU-s per 1,000"]),
        ("curve-flood", "zstalk flood", ["pipelined put", "native", "one at a time"])],
    "bench_limits": [("limits", "zstalk", [
        "1: 10/s, 1 dispatcher: achieved", "1: 1,000/s, 4 dispatchers",
        "2: CPU-s per 1,000 tasks", "3: ETA, rate-bound", "3: ETA, concurrency-bound"])],
    "bench_upstreams": [("upstreams", "zstalk", [
        "1: end to end, 2,000 tasks, 1 dispatcher, (a) plain url (tasks/s)",
        "(b) upstream of 1 server, round_robin: system CPU-s", "(c) upstream of 3 servers",
        "1: CPU-s per 1,000 tasks, (b) / (a)", "1: CPU-s per 1,000 tasks, (c) / (a)",
        "2: 4 dispatchers, concurrency 64, 2,000 tasks, least_conn over 3 servers: calls/s",
        "most calls on one server / fewest",
        "3: round_robin over 3, 1 dispatcher, 200 tasks/s, one server stops: its last call",
        "calls failed because of it", "tasks that did not succeed",
        "single-attempt tasks, health checks (interval 1 s, fails 1) and max_fails = 0: its "
        "last call after the stop"])],
    "bench_room": [("room", "zstalk", [
        "(a) broker up: verifies/s through 1 front process", "(a) broker up: front CPU-us",
        "(a) broker up: broker CPU-us", "(b) broker away: verifies/s through 1 front process",
        "(b) broker away: front CPU-us", "2: rate 20/s, 40 users", "2: rate 100/s, 200 users",
        "most admissions in 1 s", "3: ETA, rate-bound: 50/s, 60 users in one array: median",
        "3: ETA, concurrency-bound: 4 at once, users holding 250 ms, 16 after 12: tasks given "
        "no ETA", "4: 500 online tasks at 20/s, 100 streaming, 4 s: admissions in the window",
        "largest gap between a stream's place events", "streams with a gap over 2 s",
        "front RSS, most in the window", "4: front CPU share", "4: broker CPU share",
        "generator's own CPU share"])],
    "bench_metrics": [("metrics", "zstalk", [
        "100 tubes: scrape time, median", "100 tubes: client round trip max, scraping"])],
    "bench_groups": [("groups", "zstalk: no groups", [
        "1: enqueue, arrays of 1,000", "1: hand-out after arrays of 1,000",
        "broker CPU-s per 1,000 tasks"]),
        ("groups", "zstalk: 2,000 groups", [
            "1: enqueue, arrays of 1,000", "broker CPU-s per 1,000 tasks",
            "201 and its call, most", "small's POST → its call, median",
            "big's calls in the run"])],
    "bench_schedules": [("schedules", "zstalk", [
        "`serve --fronts 0`, 50 × `* * * * * ?`, 1 s: lateness p99", "`serve --fronts 1`",
        "fires missing", "broker CPU-s per 1,000 fires"])],
    "bench_tasks": [("tasks", "zstalk", [
        "1: enqueue, single POSTs", "2: enqueue, arrays of 1,000",
        "3: end to end: `serve` (1 process)", "3: end to end: broker + front http + 1 dispatcher",
        "system CPU-s per 1,000 tasks"])],
    "bench_workers": [("workers", "zstalk", [
        "1 producer + 1 worker process", "1 producer + 4 worker processes",
        "server CPU-s per 1,000 jobs"])],
}
NEEDS = {"bench_beanstalk": ["beanstalkd"], "bench_binlog": ["beanstalkd"],
         "bench_workers": ["beanstalkd"], "bench_counter": ["yrmcdsd"]}
#: benchmarks that start a NATS cluster (tests/support/nats_cluster.py's nats-server)
NATS = {"bench_journal", "bench_failover"}


def need(tools: list[str]) -> None:
    for tool in tools:
        needs_group("reference", tool)


def run_bench(script: str, tmp_path: Path, *args: str, python: str = sys.executable,
              env: dict | None = None) -> dict:
    out = tmp_path / f"{script}.json"
    done = subprocess.run([python, str(SCRIPTS / f"{script}.py"), "--smoke", *args,
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=RUN_CAP_S, env=env)
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return json.loads(out.read_text())


def table(doc: dict, name: str) -> dict:
    found = [t for t in doc["tables"] if t["name"] == name]
    assert found, f"no table {name!r} in {[t['name'] for t in doc['tables']]}"
    return found[0]


def figure(tbl: dict, metric_part: str, column: str) -> float | None:
    rows = [r for r in tbl["rows"] if metric_part in r["metric"]]
    assert rows, f"no row with {metric_part!r} in {[r['metric'] for r in tbl['rows']]}"
    return rows[0]["cells"].get(column, {}).get("median")


@pytest.mark.parametrize("script", sorted(ROWS))
def test_each_benchmark_runs_in_its_smoke_mode_and_reports_every_row(script, tmp_path):
    need(NEEDS.get(script, []))
    if script in NATS:
        needs_nats_server()
    doc = run_bench(script, tmp_path)
    for name, column, parts in ROWS[script]:
        tbl = table(doc, name)
        missing = [p for p in parts if figure(tbl, p, column) is None]
        assert not missing, f"{name}: rows without a figure in {column!r}: {missing}; " \
                            f"errors {doc['errors'][:5]}"
        assert "| metric |" in tbl["markdown"] and tbl["text"].startswith(tbl["title"])
    assert doc["machine"]["calibration_mturns_s"] > 0 and len(doc["machine"]["loadavg"]) == 3


def test_every_benchmark_is_an_executable_python3_script():
    for path in [*SCRIPTS.glob("bench_*.py"), SCRIPTS / "bench_readme"]:
        assert os.access(path, os.X_OK), f"{path.name} is not executable"
        assert path.read_text().startswith("#!/usr/bin/env python3\n"), path.name


def test_no_benchmark_imports_a_zstalk_module():
    for path in [*SCRIPTS.glob("bench_*.py"), *SCRIPTS.glob("harness/*.py")]:
        lines = [line.strip() for line in path.read_text().splitlines()]
        bad = [line for line in lines if line.startswith(("import zstalk", "from zstalk"))
               and "zstalk.workers" not in line]
        assert not bad, f"{path.name}: {bad}"


def test_against_head_runs_the_built_tree_beside_this_one(tmp_path):
    need(["yrmcdsd"])
    sys.path.insert(0, str(SCRIPTS))
    try:
        from harness.builds import BuildError, against
        try:
            build = against("HEAD", log=lambda msg: None)
        except (BuildError, OSError) as exc:
            pytest.skip(f"could not build HEAD into the benchmark cache: {exc}")
    finally:
        sys.path.remove(str(SCRIPTS))
    doc = run_bench("bench_counter", tmp_path, "--against", "HEAD")
    tbl = table(doc, "counter")
    assert [c["key"] for c in tbl["columns"]] == ["yrmcds", "zstalk", "zstalk@HEAD"]
    assert "zstalk/zstalk@HEAD" in [r["header"] for r in tbl["ratios"]]
    assert figure(tbl, "8 connections pipelined", "zstalk@HEAD")
    assert tbl["rows"][0]["ratios"]["zstalk/zstalk@HEAD"] > 0
    assert doc["builds"][1]["commit"] == build.commit
    assert Path(doc["builds"][1]["root"], ".built").exists()


def test_bench_readme_rewrites_the_block_of_a_benchmark_it_ran(tmp_path):
    need(["yrmcdsd"])
    readme = tmp_path / "performance.md"
    original = (ROOT / "docs" / "performance.md").read_text()
    readme.write_text(original)
    done = subprocess.run([sys.executable, str(SCRIPTS / "bench_readme"), "--smoke", "--only",
                           "counter", "--page", str(readme)], cwd=ROOT, capture_output=True,
                          text=True, timeout=RUN_CAP_S)
    assert done.returncode == 0, done.stderr[-3000:]
    text = readme.read_text()
    block = text.split("<!-- bench:counter -->\n")[1].split("<!-- /bench:counter -->")[0]
    assert block.startswith("*Measured ") and "load average" in block and "calibration" in block
    assert "`scripts/bench_counter.py --smoke`, by `scripts/bench_readme`" in block
    assert "| acquire+release, 8 connections pipelined (pairs/s) |" in block
    before, after = original.split("<!-- bench:counter -->"), text.split("<!-- bench:counter -->")
    assert before[0] == after[0]
    assert before[1].split("<!-- /bench:counter -->")[1] == after[1].split(
        "<!-- /bench:counter -->")[1]


def test_a_benchmark_started_by_the_system_python3_reexecs_under_the_project_venv(tmp_path):
    need(["yrmcdsd"])
    system = getattr(sys, "_base_executable", None) or shutil.which("python3")
    stamps = glob.glob(str(ROOT / ".venv" / ".zstalk-installed-*"))
    if not stamps:
        pytest.skip("no .venv stamp: scripts/_venv.sh has not made .venv here")
    # the extras .venv was made with, so scripts/_venv.sh finds it up to date
    extras = sorted(stamps, key=os.path.getmtime)[-1].rsplit("-installed-", 1)[1]
    env = dict(os.environ, ZSTALK_EXTRAS="" if extras == "base" else extras)
    env.pop("VIRTUAL_ENV", None)
    doc = run_bench("bench_counter", tmp_path, python=system, env=env)
    assert doc["python"] == str(ROOT / ".venv" / "bin" / "python")
    assert figure(table(doc, "counter"), "1 connection pipelined", "zstalk")
