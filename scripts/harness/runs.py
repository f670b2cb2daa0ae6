# One measured run of a system with processes of its own, and the rotations a
# benchmark's parts are made of (bench_limits, bench_upstreams, bench_room).
#
# A part is rows, each with the systems it compares: (column, make, fn) or (column,
# make, fn, check).  A run names itself r1, r2, ... (a function name of its own, so
# counts never mix), makes the system (`make(name)`: fresh processes, not yet started),
# starts it, takes its sample (`fn(name, system)`: a dict with an "errors" list) and
# stops it in a `finally`, keeping what stopping noticed; then `check(name, sample)`, if
# the system has one, adds to the sample's errors what it finds wrong, from counts read
# once every process of the run has stopped.  A run that raises is aborted: noted,
# counted per (part, row), no sample.  A rotation runs each row's systems once per
# repetition in stats.rounds()' alternated order, warm-up rounds first, their samples
# dropped.  Samples land in results[part][row][column], a list per column.  run_parts
# runs the parts a command line chose (--parts), each timed in the log.
from __future__ import annotations

import collections
import time

from .cli import Run, log
from .stats import rounds


class Runs:
    def __init__(self, run: Run, parts, shown=()) -> None:
        """parts: the results' keys; shown: sample keys the progress line prints."""
        self.run, self.args, self.shown = run, run.args, tuple(shown)
        self.results: dict[str, dict] = {part: {} for part in parts}
        self.aborted: collections.Counter = collections.Counter()
        self.runs = 0

    def measure(self, part: str, row: str, column: str, make, fn, warm: bool,
                check=None) -> None:
        self.runs += 1
        name = f"r{self.runs}"
        notes: list[str] = []
        system = None
        try:
            system = make(name)
            system.start()
            s = fn(name, system)
        except Exception as exc:
            s = None
            notes.append(f"aborted: {exc!r}")
        finally:
            if system is not None:
                system.stop(notes)
        where = f"{row} / {column}{' (warm-up)' if warm else ''}"
        self.run.notes += [f"{where} ({part}, run {name}): {note}" for note in notes]
        if s is None:
            self.aborted[part, row] += 1
            log(f"  {where}: aborted, see the notes")
            return
        if check is not None:
            check(name, s)
        if not warm:
            self.results[part].setdefault(row, {}).setdefault(column, []).append(s)
        shown = [f"{k} {s[k]:.4g}" for k in self.shown if s.get(k) is not None]
        flags = " CAPPED" if s.get("capped") else ""
        flags += f" ERRORS {s['errors'][:2]}" if s["errors"] else ""
        log(f"  {where}: {', '.join(shown)}{flags}")

    def rotation(self, part: str, rows: list[tuple[str, list]], repeats: int | None = None
                 ) -> None:
        """Every row's systems, alternated, --repeats times (or `repeats`) after --warmup."""
        for row, systems in rows:
            log(f" {row}")
            for rep, order, warm in rounds(systems, repeats or self.args.repeats,
                                           self.args.warmup):
                for column, make, fn, *check in order:
                    self.measure(part, row, column, make, fn, warm, *check)

    def flags(self, part: str, row: str, per: dict) -> str:
        """" [capped]" when a run of the row was, and how many runs were aborted."""
        n = self.aborted[part, row]
        return (" [capped]" if any(s.get("capped") for r in per.values() for s in r) else "") \
            + (f" [{n} runs aborted]" if n else "")


def run_parts(steps, chosen) -> None:
    """Each (number, label, fn) of `steps` whose number is in `chosen`, in turn."""
    for num, label, fn in steps:
        if num in chosen:
            log(f"{label} ...")
            t0 = time.monotonic()
            fn()
            log(f"  ({time.monotonic() - t0:.1f}s)")
