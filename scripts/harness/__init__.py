"""The harness every scripts/bench_*.py runs on; each benchmark file holds only its rows.

Running
-------
`scripts/bench_<name>.py [--quick | --smoke] [--repeats N] [--warmup N] [--against REF]
[--json PATH]`.  The files are executable and re-exec themselves under the project's
.venv/bin/python (made first if missing, by scripts/_venv.sh; venv.py), so
`python3 scripts/bench_<name>.py` works too.  `scripts/bench_readme` runs the manual's whole
set and rewrites docs/performance.md's tables between their markers (readme.py).

Method shared by every row
--------------------------
* Servers run on 127.0.0.1 only, each on a free port picked just before it starts
  (procs.free_port), each process in a session of its own so that its whole tree can be
  stopped: SIGTERM, then SIGKILL to the group after a grace period, in a `finally` per
  run, an atexit hook and a SIGTERM / SIGHUP handler (procs.guard_exits).  What a
  process wrote (beyond zstalk's start-up line), exit statuses other than 0 / SIGTERM,
  processes left behind, children restarted, and replies that were not the expected
  ones are listed at the end ("errors and notes").
* Every run that holds state gets fresh server processes, so what one run left behind
  never weighs on the next.  Loops are bounded in count and in time: a run that hits
  its time cap reports what finished by then and is flagged "capped".
* Alternation: each repetition runs every system of a row once (the reference server,
  zstalk, zstalk at --against's ref...), the order reversed every other repetition, so
  a slow phase of the machine (it drifts 2-3x on a shared VM) falls on all alike.
  --warmup rounds (1 by default) run first, untimed: page cache, first imports.
* Figures: every cell is the MEDIAN of the --repeats runs (3; bench_beanstalk 5,
  bench_counter 9) with their spread, min-max, in brackets; one run prints the value
  alone.  Not the best run: a best run is the luckiest, and two tables' lucky runs differ
  by luck; the spread says how far the runs disagreed, and a ratio within the spreads is
  no difference.  Every sample is in the JSON.  Ratios are ratios of medians.
* CPU: rows bound by the server's CPU also give the server's CPU-seconds per 1,000
  operations: utime + stime (/proc/<pid>/stat) of the server's whole process tree over
  the timed part, / operations x 1,000.  It is the figure that moves least with the
  machine's load: a busy neighbour slows a run down, it does not make each operation
  cost more CPU.  Load generators record their own CPU share too (1.0 = one core): a
  generator near 1.0 is the limit itself.
* Machine check (machine.py): every table's caption says when, on what CPU, at what
  load average, and a single-core calibration (a fixed pure-Python loop, M turns/s), so
  tables from different days can be compared, and the command that made it.
* --against REF (builds.py) builds REF once into ~/.cache/zstalk-bench/<commit>/ and runs
  its zstalk beside this tree's in every alternation: the tables get a column for it and
  the ratio this tree / REF beside the ratio to the reference server.  Servers are
  started through each tree's own .venv/bin/zstalk and zstalkd; a row that measures the
  SDK (zstalk.workers) runs its clients as subprocesses in each tree's own python.  No
  benchmark imports zstalk's modules itself.

Modules
-------
procs      processes (own session, output kept, stopped whole), /proc readers, CPU meters
builds     this tree and --against REF's build, cached by commit
machine    the machine check and the calibration loop
stats      Figure (median, min-max, n), percentiles, alternated rounds
runs       one run of a system (fresh processes, stopped whole, checked), rotations of runs
table      one table model, rendered as text, Markdown and JSON
cli        shared options, quick / smoke sizes, the Run and its report
beanstalk  a beanstalk-protocol server under test; a blocking client for set-up work
loadgen    the pipelined beanstalk load generators (put, timed put, worker cycle, D in
           flight)
probes     one command at a time: rates, per-request round trips, a background load
minimal    the minimal client, a process of its own: blocking sockets, one command (or one
           batch) at a time per connection, nothing else; or greenstalk as the client
floor_server  a bare uvloop protocol with canned replies: the floor of a one-at-a-time row
ceiling    the rule that marks a row generator-bound (not a result), and how tables say it
hotpath    bench_beanstalk's rows 6 and 8 (the hot-path check) with their ceiling and floor
timers     bench_beanstalk's row 5: how late delays and TTRs fire, as a client sees it
http       the task API's benchmarks: readiness probes, aiohttp sessions on uvloop
httpload   a raw-socket keep-alive HTTP/1.1 generator: pre-built GETs, answers tallied
sse        event streams by the thousand from one process, over many loopback source
           addresses (the fronts' per-address cap)
readme     rewrites docs/performance.md's tables between <!-- bench:NAME --> markers
nats       the NATS JetStream cluster of the journal's benchmarks (the tests' own helper)
venv       the re-exec under the project's .venv
"""
