# What every benchmark's command line has in common, and its report.
#
# parser() gives the shared options: --quick (small counts, one repetition: a look in a
# minute), --smoke (the smallest counts that still run every row: seconds, for the
# tests), --repeats, --warmup, --against REF and --json PATH.  sized() fills each count
# option a benchmark leaves unset from its (full, quick, smoke) values.
#
# A Run is one invocation: it guards the exits (nothing started outlives it), checks the
# machine, builds --against's ref, logs progress to stderr, and at the end prints every
# table (text, then Markdown) with the machine line and the notes to stdout and writes
# the JSON document (tables, raw samples, notes, errors, machine, builds) to --json.
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time

from . import machine
from .builds import BuildError, builds
from .procs import Proc, guard_exits


def parser(doc: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="small counts, one repetition, no warm-up (a look, not a figure)")
    ap.add_argument("--smoke", action="store_true",
                    help="the smallest counts that run every row (seconds; for the tests)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="alternated runs per row and system (3; 1 with --quick / --smoke)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed alternated rounds before them (1; 0 with --quick / --smoke)")
    ap.add_argument("--against", metavar="REF", default=None,
                    help="also run zstalk as of git REF (built once into "
                         "~/.cache/zstalk-bench/<commit>), alternated with this tree's")
    ap.add_argument("--json", metavar="PATH", help="write the tables and samples as JSON")
    return ap


def mode(args) -> str:
    return "smoke" if args.smoke else "quick" if args.quick else "full"


def sized(args, **values) -> None:
    """name=(full, quick, smoke): set args.name when the command line left it unset."""
    values.setdefault("repeats", (3, 1, 1))
    values.setdefault("warmup", (1, 0, 0))
    i = ("full", "quick", "smoke").index(mode(args))
    for name, choice in values.items():
        if getattr(args, name, None) is None:
            setattr(args, name, choice[i])


def ints(text: str) -> list[int]:
    """A comma-separated option's numbers ("1,3" -> [1, 3]; "" -> [])."""
    return [int(x) for x in str(text).split(",") if x.strip()]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Run:
    def __init__(self, name: str, args) -> None:
        self.name, self.args = name, args
        self.t0 = time.monotonic()
        guard_exits()
        self.machine = machine.check()
        self.command = " ".join(["scripts/" + os.path.basename(sys.argv[0])]
                                + [shlex.quote(a) for a in sys.argv[1:]])
        self.notes: list[str] = []
        try:
            self.builds = builds(args.against, log=log)
        except (BuildError, OSError) as exc:
            sys.exit(f"--against {args.against}: {exc}")
        log(f"{name}: {self.command}")
        log(f"machine: {machine.describe(self.machine)}")
        for b in self.builds:
            log(f"  {b.describe()}")
        warning = machine.busy_warning(self.machine)
        if warning:
            log(f"WARNING: {warning}")
            self.notes.append(warning)

    @property
    def mode(self) -> str:
        return mode(self.args)

    def labels(self) -> list[str]:
        return [b.label for b in self.builds]

    def against_ratios(self) -> list[tuple[str, str, str]]:
        """The ratio column this tree / the --against build, when there is one."""
        if len(self.builds) < 2:
            return []
        now, ref = self.builds[0].label, self.builds[1].label
        return [(now, ref, f"{now}/{ref}")]

    def method(self) -> str:
        a = self.args
        runs = ("one run per row and system (no median, no spread)" if a.repeats == 1 else
                f"median of {a.repeats} alternated runs (min–max)")
        return runs + (f" after {a.warmup} warm-up round{'s' if a.warmup != 1 else ''}"
                       if a.warmup else "")

    def caption(self) -> str:
        """The line above a generated table: what, where, when, how."""
        return (f"Measured {machine.describe(self.machine)}; {self.method()}; "
                f"`{self.command}`.")

    def report(self, tables: list, results: dict, extra: list[str] = ()) -> int:
        """Print the tables, the notes and the errors; write the JSON; exit status 0."""
        Proc.stop_all(self.notes)
        errors = collect_errors(results)
        after = [round(x, 2) for x in os.getloadavg()]
        out = [self.caption(), ""]
        for t in tables:
            out += [t.text(), "", t.markdown(), ""]
        out += list(extra)
        out += ["", "errors and notes:" if errors or self.notes else
                "no errors, no unexpected process output"]
        out += ["  " + e.replace("\n", "\n    ") for e in errors + self.notes]
        elapsed = time.monotonic() - self.t0
        out.append(f"\ntotal time {elapsed:.1f}s, load average at the end "
                   f"{' / '.join(map(str, after))}")
        print("\n".join(out), flush=True)
        if self.args.json:
            self._write_json(tables, results, errors, after, elapsed)
        return 0

    def _write_json(self, tables, results, errors, after, elapsed) -> None:
        doc = dict(benchmark=self.name, command=self.command, mode=self.mode,
                   python=sys.executable,
                   repeats=self.args.repeats, warmup=self.args.warmup, method=self.method(),
                   caption=self.caption(), machine=self.machine, loadavg_after=after,
                   builds=[b.as_json() for b in self.builds], elapsed_s=round(elapsed, 1),
                   tables=[t.as_json() for t in tables], errors=errors, notes=self.notes,
                   results=results)
        with open(self.args.json, "w") as f:
            json.dump(doc, f, indent=1, default=str)
        log(f"JSON written to {self.args.json}")


def collect_errors(results, path: str = "") -> list[str]:
    """Every non-empty "errors" list in the raw results, with where it was."""
    out = []
    if isinstance(results, dict):
        if results.get("errors"):
            out.append(f"{path or '/'}: {results['errors'][:3]}")
        for k, v in results.items():
            if k != "errors":
                out += collect_errors(v, f"{path}/{k}")
    elif isinstance(results, list):
        for i, v in enumerate(results):
            out += collect_errors(v, f"{path}[{i}]")
    return out
