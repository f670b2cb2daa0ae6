# The machine check printed above every table, so two tables from different days can be
# compared: the CPU model and count, the load average, and a short single-core
# calibration, a fixed pure-Python loop timed by the wall clock (median of 5 runs of
# ~20 ms each; stolen time and frequency changes show in it as they do in the figures).
# A machine that runs at half its calibration of another day gives figures to be read
# at half.
from __future__ import annotations

import os
import platform
import subprocess
import sys
import time

CAL_TURNS = 300_000
CAL_RUNS = 5


def _spin(n: int) -> int:
    x = 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFF
    return x


def calibrate() -> float:
    """Millions of loop turns per second on one core (median of CAL_RUNS runs)."""
    rates = []
    for _ in range(CAL_RUNS):
        t0 = time.perf_counter()
        _spin(CAL_TURNS)
        rates.append(CAL_TURNS / (time.perf_counter() - t0) / 1e6)
    return sorted(rates)[CAL_RUNS // 2]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or "?"


def check() -> dict:
    return dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), cpu=cpu_model(),
                nproc=os.cpu_count(), kernel=platform.release(),
                python=sys.version.split()[0], loadavg=[round(x, 2) for x in os.getloadavg()],
                calibration_mturns_s=round(calibrate(), 2))


def describe(m: dict) -> str:
    """One line: date, machine, load average, calibration."""
    load = " / ".join(f"{x:.2f}" for x in m["loadavg"])
    return (f"{m['date']}, {m['nproc']} × {m['cpu']}, Linux {m['kernel']}, Python "
            f"{m['python']}; load average {load}; calibration {m['calibration_mturns_s']:.1f} "
            f"M loop turns/s on one core")


def tool_version(argv: list[str]) -> str | None:
    """What `argv` (a reference server's version flag) prints, or None."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout or out.stderr).strip() or None


def filesystem_of(path: str) -> str:
    """The filesystem a path is on, as "ext4 at /" (its mount point from /proc/mounts)."""
    best_mount, fstype = "", "?"
    with open("/proc/mounts") as f:
        for line in f:
            _dev, mount, kind = line.split()[:3]
            inside = path == mount or path.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) > len(best_mount):
                best_mount, fstype = mount, kind
    return f"{fstype} at {best_mount}"


def busy_warning(m: dict) -> str | None:
    if m["loadavg"][0] > 0.5 * (m["nproc"] or 1):
        return (f"the machine is busy (load average {m['loadavg'][0]:.2f} on "
                f"{m['nproc']} cores): figures will be low and spread wide")
    return None


def load_range(results) -> str | None:
    """"0.71–1.95": the range of the 1-minute load averages recorded with a benchmark's runs
    (each run's "load1", wherever it is in the results), or None when none was."""
    seen = []

    def walk(node) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("load1"), (int, float)):
                seen.append(node["load1"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(results)
    return f"{min(seen):.2f}–{max(seen):.2f}" if seen else None
