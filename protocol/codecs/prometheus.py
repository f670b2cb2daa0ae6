"""Prometheus' text exposition format (0.0.4), and the one table of zstalk's metrics.

`METRICS` names every metric any zstalk process exports: its name, type, help, labels and,
for a histogram, its bucket bounds; the manual's list (docs/operations/metrics.md) is
generated from it and a test keeps the two equal.  A process gathers `Sample`s (a metric's name, its label values in the
table's order, and a number or a `Histogram`) and `render` writes them grouped by metric,
in the table's order, each family with its `# HELP` and `# TYPE`.

Why not prometheus-client: measured here its `generate_latest` took ~41 ms for 100 tubes
and importing it 68 ms, where a scrape must not hold the broker's loop 10 ms; writing the
format is a few lines, and the tests parse what this writes with prometheus-client's own
parser and check it with `promtool`.

Histograms are plain lists of bucket counts: `observe` is one `bisect` in C and two adds
(the events they count are the hot path's), cumulated only when rendered.
"""
from bisect import bisect_left
from typing import Iterable, NamedTuple

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: bucket bounds in seconds: waits and run times from a millisecond to an hour; latencies
#: of timers, links and fsyncs from 100 µs to 10 s
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0,
                900.0, 3600.0)
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 10.0)
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                300.0, 900.0)


class Metric(NamedTuple):
    name: str
    type: str                   # counter | gauge | histogram
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    role: str = "broker"        # who exports it: broker, front, dispatcher, pool,
    #                             supervisor (serve --fronts N), any


METRICS: tuple[Metric, ...] = (
    Metric("zstalk_build_info", "gauge", "1, labelled with the version and the role of the "
           "process.", ("version", "role"), role="any"),
    Metric("zstalk_child_up", "gauge", "1 when the supervisor of serve --fronts N read this "
           "child's metrics at this scrape, 0 when it did not answer (its samples are then "
           "missing).", ("role",), role="supervisor"),
    # -- the broker: beanstalk ------------------------------------------------------------
    Metric("zstalk_jobs", "gauge", "Jobs in every tube, by state.", ("state",)),
    Metric("zstalk_tube_jobs", "gauge", "Jobs by tube and state (the most active tubes; "
           "the rest as tube=\"_other\").", ("tube", "state")),
    Metric("zstalk_tube_oldest_ready_age_seconds", "gauge", "How long the tube's oldest ready "
           "job has been ready (0 with none).", ("tube",)),
    Metric("zstalk_commands_total", "counter", "Beanstalk commands by name, as the cmd-* of "
           "stats count them.", ("command",)),
    Metric("zstalk_tube_puts_total", "counter", "Jobs put into the tube.", ("tube",)),
    Metric("zstalk_job_wait_seconds", "histogram", "How long a job was ready before a "
           "reserve (or a worker pool) took it.", ("tube",), WAIT_BUCKETS),
    Metric("zstalk_job_run_seconds", "histogram", "From the reserve of a job to its delete.",
           ("tube",), WAIT_BUCKETS),
    Metric("zstalk_timer_lateness_seconds", "histogram", "How late the broker's timers (delays, "
           "TTRs, timeouts, tasks, schedules) fired.", (), LATENCY_BUCKETS),
    Metric("zstalk_sessions", "gauge", "Client connections and sessions the broker holds, by "
           "the kind of front they came through.", ("kind",)),
    Metric("zstalk_fronts", "gauge", "Fronts, dispatchers and worker pools the broker "
           "knows, by kind.", ("kind",)),
    Metric("zstalk_pool_credits", "gauge", "Jobs the worker pools can take now (their free "
           "credits)."),
    Metric("zstalk_counters", "gauge", "Counters (yrmcds protocol) in use."),
    Metric("zstalk_counters_held", "gauge", "Units held over all counters."),
    Metric("zstalk_binlog_bytes", "gauge", "Bytes of the binlog's live records."),
    Metric("zstalk_binlog_fsync_seconds", "histogram", "How long each fsync of the binlog "
           "took.", (), LATENCY_BUCKETS),
    Metric("zstalk_binlog_compaction_copies_total", "counter", "Records compaction copied "
           "forward (binlog-records-migrated)."),
    Metric("zstalk_journal_bytes", "gauge", "Bytes of the NATS journal's live records "
           "(--journal)."),
    Metric("zstalk_journal_stream_bytes", "gauge", "Bytes the journal's stream holds, live "
           "or not (compaction starts past twice the live bytes plus 8 MiB)."),
    Metric("zstalk_journal_ack_seconds", "histogram", "From an append's send to NATS's "
           "acknowledgement of it and every earlier one.", (), LATENCY_BUCKETS),
    Metric("zstalk_journal_appends_in_flight", "gauge", "Appends sent and not yet "
           "acknowledged (replies wait for them)."),
    Metric("zstalk_journal_compaction_copies_total", "counter", "Records the journal's "
           "compaction copied forward (binlog-records-migrated)."),
    Metric("zstalk_journal_leading", "gauge", "1 on the instance that leads (its broker "
           "built), 0 on a standby (--journal)."),
    Metric("zstalk_journal_epoch", "gauge", "The lease's epoch this broker leads under: one "
           "more at each failover or handover (a standby: the epoch of the leader it saw "
           "last, 0 for none)."),
    Metric("zstalk_journal_takeover_seconds", "gauge", "How long this broker took to lead, "
           "from the lease claimed to the broker built (the stream's tail read, the fence)."),
    Metric("zstalk_journal_standby_lag_messages", "gauge", "Messages of the stream a warm "
           "standby had not folded in when it last said (every 2 s), by its instance id "
           "(not `instance`: Prometheus sets that label); on a standby, its own, now.",
           ("standby",)),
    # -- the broker: cloud tasks and schedules -----------------------------------------------
    Metric("zstalk_tasks_enqueued_total", "counter", "Tasks enqueued, by function.",
           ("function",)),
    Metric("zstalk_tasks_started_total", "counter", "Calls started, by function.",
           ("function",)),
    Metric("zstalk_tasks_finished_total", "counter", "Tasks finished, by function and "
           "outcome (success, failed, cancelled).", ("function", "outcome")),
    Metric("zstalk_task_retries_total", "counter", "Calls that failed and were retried, by "
           "function.", ("function",)),
    Metric("zstalk_task_call_seconds", "histogram", "How long a function's calls took, by "
           "function.", ("function",), CALL_BUCKETS),
    Metric("zstalk_tasks", "gauge", "Tasks not finished, by function and state (due, "
           "delayed, running).", ("function", "state")),
    Metric("zstalk_task_oldest_queued_age_seconds", "gauge", "How long the function's oldest "
           "queued task has waited since it was enqueued (0 with none).", ("function",)),
    Metric("zstalk_schedule_fires_total", "counter", "Cron schedule fires (each enqueues a task)."),
    Metric("zstalk_schedule_lateness_seconds", "histogram", "How late cron schedules fired.",
           (), LATENCY_BUCKETS),
    Metric("zstalk_upstream_server_up", "gauge", "1 while the server passes its upstream's "
           "active health checks, 0 while it fails them and every pick skips it (upstreams "
           "with a health_check only; server: its url as configured).", ("upstream", "server")),
    Metric("zstalk_upstream_server_last_check_timestamp_seconds", "gauge", "When the last "
           "result of the server's active health check came (Unix time; absent before the "
           "first).", ("upstream", "server")),
    # -- fronts ---------------------------------------------------------------------------
    Metric("zstalk_front_connections", "gauge", "Client connections open.", ("kind",),
           role="front"),
    Metric("zstalk_front_commands_total", "counter", "Commands (requests) clients sent.",
           ("kind",), role="front"),
    Metric("zstalk_front_own_replies_total", "counter", "Replies the front made itself "
           "(errors of the protocol, refusals), not the broker.", ("kind",), role="front"),
    Metric("zstalk_front_link_round_trip_seconds", "histogram", "From sending a batch of "
           "commands to the broker to its replies.", ("kind",), LATENCY_BUCKETS, role="front"),
    Metric("zstalk_front_held_total", "counter", "Commands held while no broker answered.",
           ("kind",), role="front"),
    # -- dispatchers and worker pools -----------------------------------------------------------
    Metric("zstalk_dispatcher_calls_in_flight", "gauge", "Calls being made now.",
           role="dispatcher"),
    Metric("zstalk_dispatcher_reports_pending", "gauge", "Outcomes reported and not yet "
           "noted by the broker (sent again after a reconnect).", role="dispatcher"),
    Metric("zstalk_pool_jobs_total", "counter", "Jobs a worker pool's handlers ran, by outcome: "
           "deleted, released, buried (the broker took the handler's answer); lost (the job "
           "was no longer the pool's when its handler finished: its TTR ran out, or the pool "
           "handed it back on stopping); refused (the broker refused the answer, having no "
           "binlog space); expired (not run: it waited its whole TTR in the pool).",
           ("outcome",), role="pool"),
    Metric("zstalk_pool_handler_seconds", "histogram", "How long handlers ran (every outcome "
           "but expired).", (), CALL_BUCKETS, role="pool"),
)
BY_NAME = {m.name: m for m in METRICS}
_WHO = {"broker": "broker", "front": "fronts", "dispatcher": "dispatcher", "pool": "worker pool",
        "supervisor": "serve --fronts N", "any": "every process"}


def readme_table() -> str:
    """docs/operations/metrics.md's list of metrics (a test keeps the two equal)."""
    rows = ["| metric | type | labels | from | what |", "|---|---|---|---|---|"]
    for m in METRICS:
        labels = ", ".join(f"`{name}`" for name in m.labels) or "-"
        what = m.help.replace("|", "\\|")
        if m.buckets:
            what += " Buckets: " + ", ".join(_number(b) for b in m.buckets) + " s."
        rows.append(f"| `{m.name}` | {m.type} | {labels} | {_WHO[m.role]} | {what} |")
    return "\n".join(rows) + "\n"


class Histogram:
    """Bucket counts (the last is +Inf) and the sum of what was observed."""
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1      # le: a bound holds its value
        self.sum += value

    def add(self, other: "Histogram") -> None:
        for i, n in enumerate(other.counts):
            self.counts[i] += n
        self.sum += other.sum

    @property
    def count(self) -> int:
        return sum(self.counts)


class Sample(NamedTuple):
    name: str
    labels: tuple = ()          # values, in the order of the metric's labels
    value: object = 0           # int, float or Histogram


def render(samples: Iterable[Sample], extra: dict[str, str] | None = None) -> bytes:
    """The exposition of `samples`, families in METRICS' order; `extra` labels (a role) go
    first on every line."""
    by_name: dict[str, list[Sample]] = {}
    for s in samples:
        by_name.setdefault(s.name, []).append(s)
    first = [f'{k}="{_escape(str(v))}"' for k, v in (extra or {}).items()]
    out: list[str] = []
    for m in METRICS:
        found = by_name.get(m.name)
        if not found:
            continue
        out.append(f"# HELP {m.name} {_help(m.help)}\n# TYPE {m.name} {m.type}\n")
        for s in found:
            pairs = ",".join([*first, *(f'{k}="{_escape(str(v))}"'
                                        for k, v in zip(m.labels, s.labels))])
            if m.type == "histogram":
                _histogram(out, m.name, pairs, s.value)
            else:
                out.append(f"{m.name}{{{pairs}}} {_number(s.value)}\n" if pairs else
                           f"{m.name} {_number(s.value)}\n")
    return "".join(out).encode()


def _histogram(out: list[str], name: str, pairs: str, h: Histogram) -> None:
    """Its lines (`pairs`: its other labels, written), cumulated here: a scrape of 100
    tubes writes some 3,000 bucket lines, so each is one f-string."""
    head = f"{name}_bucket{{{pairs}{',' if pairs else ''}le=\""
    running = 0
    for le, n in zip(_le_strings(h.bounds), h.counts):
        running += n
        out.append(f'{head}{le}"}} {running}\n')
    braces = f"{{{pairs}}}" if pairs else ""
    out.append(f"{name}_sum{braces} {_number(h.sum)}\n{name}_count{braces} {running}\n")


_LE: dict[tuple, tuple[str, ...]] = {}


def _le_strings(bounds: tuple[float, ...]) -> tuple[str, ...]:
    found = _LE.get(bounds)
    if found is None:
        found = _LE[bounds] = (*(_number(b) for b in bounds), "+Inf")
    return found


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def with_label(text: bytes, name: str, value: str) -> bytes:
    """Every sample of an exposition labelled `name="value"` (first), replacing the label
    where a sample has it already.  (A label value's quotes are escaped, so `{name="` or
    `,name="` can only start a label.)"""
    pair = f'{name}="{_escape(value)}"'
    out = []
    for line in text.decode().splitlines(keepends=True):
        if not line.strip() or line.startswith("#"):
            out.append(line)
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace < 0 or brace > space:          # no labels
            out.append(f"{line[:space]}{{{pair}}}{line[space:]}")
            continue
        end = _labels_end(line, brace)
        labels = _drop_label(line[brace + 1:end], name)
        out.append(f"{line[:brace]}{{{pair}{',' if labels else ''}{labels}}}{line[end + 1:]}")
    return "".join(out).encode()


def _labels_end(line: str, brace: int) -> int:
    """The index of the `}` closing the labels that open at `brace`."""
    i, quoted = brace + 1, False
    while True:
        c = line[i]
        if quoted and c == "\\":
            i += 2
            continue
        if c == '"':
            quoted = not quoted
        elif c == "}" and not quoted:
            return i
        i += 1


def _drop_label(labels: str, name: str) -> str:
    """`a="1",name="2",b="3"` less the label `name`."""
    start = 0 if labels.startswith(f'{name}="') else labels.find(f',{name}="')
    if start < 0:
        return labels
    i = labels.index('"', start) + 1          # the value's first character
    while labels[i] != '"':
        i += 2 if labels[i] == "\\" else 1
    rest = labels[i + 1:]
    if start == 0:
        return rest[1:] if rest.startswith(",") else rest
    return labels[:start] + rest


def merge(parts: Iterable[bytes]) -> bytes:
    """Several processes' expositions as one (a supervisor's, a pool's parent): each
    family's HELP and TYPE once, its samples from every part in turn."""
    families: dict[str, list[str]] = {}
    heads: dict[str, str] = {}
    order: list[str] = []
    for part in parts:
        name = None
        for line in part.decode().splitlines(keepends=True):
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                name = line.split(" ", 3)[2]
                if name not in families:
                    families[name], heads[name] = [], ""
                    order.append(name)
                if line not in heads[name]:
                    heads[name] += line
            elif name is not None and line.strip():
                families[name].append(line)
    return "".join(heads[n] + "".join(families[n]) for n in order).encode()
