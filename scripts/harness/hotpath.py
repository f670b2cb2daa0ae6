# Rows 6 and 8 of bench_beanstalk, the hot-path check (`--rows hot`, i.e. 6,8; with
# --against REF for a change): one command at a time and the pipelines clients use, with
# the generator ceiling and the floor that say how much of a figure is the server's.
#
# Every run is a fresh server and one client; the runs a variant compares take their
# turns in one alternation (the servers and clients together, the order reversed every
# other repetition), so a slow phase of the machine falls on all alike.  A run's name says
# its server and its client:
#
#   <system>               the minimal client (minimal.py, a process of its own) on <system>
#   <system> · greenstalk  greenstalk itself as the client (row 6): what its users see
#   beanstalkd · loop      the harness's own generator, the selectors loop of loadgen.py
#                          that drives rows 1, 2, 4 and 8's windows, on beanstalkd: the
#                          generator ceiling, held against the minimal client there
#   floor                  the minimal client on floor_server.py, a bare uvloop protocol
#                          answering every command with a canned reply
#
# Runs of the cycle kind first fill their server (pipelined, 8 connections) with the jobs
# the run and its warm-up take plus 100, and check the ready count with `stats` afterwards.
# Results land in bench.results["one" | "pipe"][variant][name], one dict per run; the
# tables' rows are made here too, with ceiling.py's verdicts in their result column.
from __future__ import annotations

from .beanstalk import BeanstalkServer, stats_of
from .ceiling import bound_by_cpu, bound_one_at_a_time, ceiling_said, verdict
from .floor_server import floor
from .loadgen import fill, run_load, timed_load
from .minimal import COMMANDS, drive
from .stats import Figure

REFERENCE = "beanstalkd"
GREEN = " · greenstalk"
LOOP = f"{REFERENCE} · loop"
FLOOR = "floor"
WARMUP = 1000                   # commands each client sends, untimed, before its run
ONE = [("put", "put", "puts"), ("cycle", "reserve+delete", "cycles")]       # row 6
PIPE = [        # row 8: (key, label, client, kind, connections, in flight, target ratio)
    ("put8x32", "32 in flight, 8 conn: put (puts/s)", "window", "put", 8, 32, 1.2),
    ("put8x32b", "batches of 32, 8 conn: put (puts/s)", "minimal", "put", 8, 32, 1.0),
    ("work8x32", "32 in flight, 8 conn: reserve+delete (deletes/s)", "window", "cycle", 8, 32,
     1.0),
    ("work8x32b", "batches of 32, 8 conn: reserve+delete (deletes/s)", "minimal", "cycle", 8,
     32, 0.8),
    ("work50x1", "1 in flight, 50 conn: reserve+delete (deletes/s)", "minimal", "cycle", 50, 1,
     0.9)]
#: the one-at-a-time workloads with a ceiling and a floor: (results key, variant, label)
BOUNDED = [("one", "put", "1 conn put"), ("one", "cycle", "1 conn reserve+delete"),
           ("pipe", "work50x1", "50 conn reserve+delete")]


def client_of(name: str) -> str:
    return "greenstalk" if name.endswith(GREEN) else "loop" if name == LOOP else "minimal"


def register(bench) -> None:
    """Servers for the runs' names beside the systems' own (a greenstalk run is its
    system's server; the floor is this tree's python running floor_server.py)."""
    for s in bench.systems:
        bench.factories[s + GREEN] = renamed(bench.factories[s], s + GREEN)
    bench.factories[LOOP] = renamed(bench.factories[REFERENCE], LOOP)
    python = bench.run.builds[0].python
    bench.factories[FLOOR] = lambda: BeanstalkServer(FLOOR, lambda port: floor(python, port),
                                                     kind="canned")


def renamed(factory, name: str):
    def make():
        srv = factory()
        srv.name = name
        return srv
    return make


# --------------------------------------------------------------------------- runs

def row_one(bench) -> None:
    """Row 6: put and reserve+delete one at a time on one connection."""
    a = bench.a
    names = bench.systems + [s + GREEN for s in bench.systems] + [LOOP, FLOOR]

    def one(srv, kind):
        n = a.one_put_count if kind == "put" else a.one_cycle_count
        return client_run(bench, srv, kind, n, 1, 1, a.one_cap)
    bench.fresh_runs("one", [k for k, *_ in ONE], one, "per s", names)


def row_pipe(bench) -> None:
    """Row 8: 32 in flight and batches of 32 on 8 connections, 1 in flight on 50."""
    a = bench.a
    bounded = {v for key, v, _ in BOUNDED if key == "pipe"}

    def names(variant):
        return bench.systems + ([LOOP, FLOOR] if variant in bounded else [])

    def pipe(srv, key):
        _, _, client, kind, nc, depth, _ = next(v for v in PIPE if v[0] == key)
        if client == "window" and kind == "put":
            return timed_load(srv, "put", nc, a.put_count, depth, a.put_cap,
                              gen_procs=a.gen_procs)
        if client == "window":
            return bench._drain_run(srv, f"work{depth}", nc, depth, a.work_count, a.work_cap)
        n, cap = (a.put_count, a.put_cap) if kind == "put" else (a.work_count, a.work_cap)
        return client_run(bench, srv, kind, n, nc, depth, cap)
    bench.fresh_runs("pipe", [v[0] for v in PIPE], pipe, "per s", names)


def client_run(bench, srv, kind: str, n: int, conns: int, batch: int, cap_s: float) -> dict:
    """n operations of one client (srv.name says which) on a fresh server, checked."""
    canned = srv.kind == "canned"
    stock = n + WARMUP // COMMANDS[kind] + 100 if kind == "cycle" and not canned else 0
    if stock:
        fill(srv, stock, bench.a.window, 120.0, gen_procs=bench.a.gen_procs)
    if client_of(srv.name) == "loop":
        res = loop_run(srv, kind, n, conns, cap_s)
    else:
        res = drive(srv.addr, kind, n, conns=conns, batch=batch, client=client_of(srv.name),
                    warmup=WARMUP, cap_s=cap_s, server=srv)
    if not canned and not res.get("capped") and res.get("count"):
        check_ready(srv, res, kind, stock)
    return res


def loop_run(srv, kind: str, n: int, conns: int, cap_s: float) -> dict:
    """The selectors loop with one command in flight per connection, after its warm-up."""
    load = "put" if kind == "put" else "work1"
    warm = run_load(srv.addr, load, conns, WARMUP // COMMANDS[kind], 1, cap_s)
    res = timed_load(srv, load, conns, n, 1, cap_s)
    res["warm_count"] = warm["count"]
    res["errors"] = [f"warm-up: {e}" for e in warm["errors"]] + res["errors"]
    return res


def check_ready(srv, res: dict, kind: str, stock: int) -> None:
    """The server's ready count after a run: every put is ready, every cycle took one."""
    done = res["count"] + res.get("warm_count", 0)
    want = done if kind == "put" else stock - done
    ready = int(stats_of(srv.addr).get("current-jobs-ready", -1))
    if ready != want:
        res["errors"].append(f"ready after = {ready}, expected {want}")


# --------------------------------------------------------------------------- table rows

def fig(bench, key: str, variant: str, name: str, stat: str = "rate") -> Figure:
    return Figure.of(bench.results.get(key, {}).get(variant, {}).get(name), stat)


def cpu_verdict(bench, key: str, variant) -> str | None:
    """A pipelined or batch row's verdict from its generator's CPU, column by column."""
    return verdict(bound_by_cpu({s: fig(bench, key, str(variant), s, "gen_cpu_share").median
                                 for s in bench.systems}))


def one_rows(bench, t) -> None:
    """Row 6's table rows, each workload with its greenstalk, ceiling and floor rows."""
    if "one" not in bench.results:
        return
    vs_ref = f"{bench.systems[1]}/{REFERENCE}"
    for kind, label, unit in ONE:
        rate_row(bench, t, "one", kind, f"one at a time, 1 conn: {label} ({unit}/s)", unit,
                 target=(vs_ref, ">=", 0.8))
        minimal = fig(bench, "one", kind, REFERENCE).median
        green = {s: fig(bench, "one", kind, s + GREEN) for s in bench.systems}
        t.add(f"  greenstalk as the client ({unit}/s)", green,
              result=verdict(bound_one_at_a_time(green[REFERENCE].median, minimal)))
        bounded_rows(bench, t, "one", kind, f"1 conn {label}", unit)


def pipe_rows(bench, t) -> None:
    """Row 8's table rows; the 50-connection row with its ceiling and floor."""
    if "pipe" not in bench.results:
        return
    vs_ref = f"{bench.systems[1]}/{REFERENCE}"
    for key, label, _, kind, nc, _, goal in PIPE:
        unit = label.split("(")[1].split("/")[0]
        cpu_goal = (vs_ref, "<=", 1.25) if key == "work50x1" else None
        rate_row(bench, t, "pipe", key, label, unit, target=(vs_ref, ">=", goal),
                 cpu_target=cpu_goal, result=cpu_verdict(bench, "pipe", key))
        if key == "work50x1":
            bounded_rows(bench, t, "pipe", key, "50 conn reserve+delete", unit)


def rate_row(bench, t, key, variant, metric, unit, target=None, cpu_target=None,
             result=None) -> None:
    """A rate row and its server CPU-s per 1,000 operations below it."""
    t.add(metric, {s: fig(bench, key, variant, s) for s in bench.systems}, target=target,
          result=result)
    t.add(f"  server CPU-s per 1,000 {unit}",
          {s: fig(bench, key, variant, s, "cpu_per_1k") for s in bench.systems}, fmt="{:.4g}",
          target=cpu_target)


def bounded_rows(bench, t, key: str, variant: str, label: str, unit: str) -> None:
    """The generator ceiling (the selectors loop on beanstalkd, held against the minimal
    client there) and the floor (the minimal client on a canned-reply uvloop server), with
    each zstalk column's share of the floor."""
    loop = fig(bench, key, variant, LOOP)
    minimal = fig(bench, key, variant, REFERENCE).median
    t.add(f"  generator ceiling, {label}: the harness's selectors loop ({unit}/s)",
          {REFERENCE: loop}, result=ceiling_said(loop.median, minimal))
    base = fig(bench, key, variant, FLOOR)
    zstalks = bench.systems[1:]
    t.add(f"  floor, {label}: the minimal client on bare uvloop, canned replies ({unit}/s)",
          {zstalks[0]: base}, ratio=False)
    t.add(f"  {label}: zstalk / the floor (x, of medians)",
          {s: ratio(fig(bench, key, variant, s).median, base.median) for s in zstalks},
          fmt="{:.2f}", ratio=False)


def ratio(a, b) -> list:
    return [a / b] if a is not None and b else []
