# The processes a benchmark starts, and what /proc says about them.
#
# Every server, worker, flooder or helper a benchmark starts is a Proc: its own session
# (so its process group is its whole tree, and one killpg stops it), its output in a temp
# file (read for the notes at the end), and an entry in Proc.live until it is stopped.
# guard_exits() makes sure nothing outlives the benchmark: an atexit hook SIGKILLs every
# live group, and SIGTERM / SIGHUP become sys.exit so `finally` blocks run first.  Helper
# children also get PR_SET_PDEATHSIG, so even a SIGKILL of the benchmark takes them along;
# servers whose start is timed do not (a preexec_fn makes Popen fork instead of vfork,
# which would add the copy of this process's page tables to every start).
#
# CPU meters (ShareMeter) read utime + stime (/proc/<pid>/stat, clock ticks) summed over a process
# tree: a process's own threads are in its figure, its children are walked through
# /proc/<pid>/task/*/children.
from __future__ import annotations

import atexit
import collections
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOST = "127.0.0.1"
TICKS = os.sysconf("SC_CLK_TCK")
STOP_GRACE_S = 10.0
#: what zstalk says on every start and every SIGTERM: not news in a benchmark's notes
ZSTALK_CHATTER = ("zstalk: beanstalk on ", "stopping: telling ")
#: every role's start line since issue 24: `zstalk ROLE VERSION: ...` (`zstalkd VERSION: ...`)
ZSTALK_START_LINE = re.compile(r"(zstalkd|zstalk [a-z][a-z ]*) \d[^\s:]*: ")


def zstalk_keep(line: str) -> bool:
    """A Proc's `keep` for zstalk's processes: all of its output but its usual chatter."""
    return not (any(c in line for c in ZSTALK_CHATTER) or ZSTALK_START_LINE.match(line))


# --------------------------------------------------------------------------- ports

#: ports handed out lately: a run takes several before its servers bind them
_GIVEN: collections.deque[int] = collections.deque(maxlen=512)


def free_port() -> int:
    """A loopback port that is free now and not one of the last 512 given, from just
    below the kernel's ephemeral range (a port inside it, what binding port 0 gives, can
    be taken by any client's connect() before the server binds it; the load generators
    open hundreds of connections)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randrange(max(1024, low - 12000), low)
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
        _GIVEN.append(port)
        return port
    with socket.socket() as s:
        s.bind((HOST, 0))
        _GIVEN.append(s.getsockname()[1])
        return _GIVEN[-1]


# --------------------------------------------------------------------------- /proc

def children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    out += [int(x) for x in f.read().split()]
            except OSError:
                pass
    except OSError:
        pass
    return out


def tree(pid: int) -> list[int]:
    """`pid` and all its descendants."""
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.append(p)
            todo += children(p)
    return seen


def _stat_fields(pid) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def cpu_s(pid) -> float:
    """utime + stime of a process (or "pid/task/tid": one thread), in seconds."""
    try:
        fields = _stat_fields(pid)
        return (int(fields[11]) + int(fields[12])) / TICKS
    except (OSError, IndexError, ValueError):
        return 0.0


def tree_cpu_s(pid: int) -> float:
    return sum(cpu_s(p) for p in tree(pid))


def rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = _stat_fields(entry)
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(entry))
    return out


def kill_group(pgid: int) -> None:
    if pgid:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def machine_busy_s() -> float:
    """CPU seconds all cores spent busy since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / TICKS


class ShareMeter:
    """CPU seconds between start() and stop(), and their shares of the wall time (1.0 =
    one core): of named groups of processes (name=callable giving their pids, read at
    both ends; a process gone by the end keeps what it had at the start), of this process
    ("gen", the load generator), and of everything else on the machine ("others":
    /proc/stat's busy time less all of ours; well above 0 means another tenant took CPU).
    `reader(pid)` gives a process's CPU seconds (utime + stime by default)."""

    def __init__(self, reader=cpu_s, **groups) -> None:
        self.reader, self.groups = reader, groups
        self.cpu: dict[str, float] = {}
        self.shares: dict[str, float] = {}

    def _read(self) -> dict[str, dict[int, float]]:
        return {name: {p: self.reader(p) for p in pids()} for name, pids in self.groups.items()}

    def start(self) -> float:
        self.c0, self.busy0, self.gen0 = self._read(), machine_busy_s(), time.process_time()
        self.t0 = time.monotonic()
        return self.t0

    def stop(self) -> float:
        t1 = time.monotonic()
        wall = t1 - self.t0
        now = self._read()
        cpu = {name: sum(v - self.c0[name].get(p, 0.0) for p, v in now[name].items())
               for name in now}
        cpu["gen"] = time.process_time() - self.gen0
        cpu["others"] = max(0.0, machine_busy_s() - self.busy0 - sum(cpu.values()))
        self.cpu = cpu
        self.shares = {f"{k}_cpu_share": round(v / wall, 3) for k, v in cpu.items()}
        return t1


def tcp_peers(pid: int) -> set[int]:
    """Remote ports of the established TCP connections process `pid` holds."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:         # closed meanwhile
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        with open(f"/proc/{pid}/net/tcp") as f:
            rows = [line.split() for line in f.readlines()[1:]]
    except OSError:
        return set()
    # columns: sl local_address rem_address st ... inode (st 01: ESTABLISHED)
    return {int(r[2].split(":")[1], 16) for r in rows if r[3] == "01" and r[9] in inodes}


# --------------------------------------------------------------------------- processes

def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the benchmark dies (PR_SET_PDEATHSIG)."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


class Proc:
    """A process a benchmark started, in a session of its own."""
    live: list["Proc"] = []

    def __init__(self, name: str, argv: list[str], *, env: dict | None = None,
                 cwd: str | None = None, keep=lambda line: True, pdeathsig: bool = True,
                 output=None) -> None:
        self.name, self.keep = name, keep
        self.out = output or tempfile.TemporaryFile("a+b")
        argv = [str(a) for a in argv]
        self.t_spawn = time.monotonic()         # (row 7 of bench_beanstalk times from here)
        self.p = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=self.out,
            stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True,
            preexec_fn=_die_with_parent if pdeathsig else None)
        Proc.live.append(self)

    @property
    def pid(self) -> int:
        return self.p.pid

    def alive(self) -> bool:
        return self.p.poll() is None

    def pids(self) -> list[int]:
        return tree(self.pid) if self.alive() else []

    def cpu_s(self) -> float:
        return sum(cpu_s(p) for p in self.pids())

    def rss_mib(self) -> float:
        return sum(rss_kib(p) for p in self.pids()) / 1024.0

    def output(self) -> str:
        """What it wrote so far (pread: the child's write offset is left alone)."""
        fd = self.out.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

    def check(self) -> None:
        if not self.alive():
            raise RuntimeError(f"{self.name} exited with {self.p.returncode}: "
                               f"{self.output()[-2000:]!r}")

    def crash(self, timeout: float = 10.0) -> None:
        """SIGKILL the whole group and wait until none of it is left (kill -9)."""
        kill_group(self.pid)
        self.p.wait(timeout)
        deadline = time.monotonic() + timeout
        while group_members(self.pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: {group_members(self.pid)} survive SIGKILL")
            time.sleep(0.01)
        Proc.live.remove(self)

    def stop(self, notes: list[str], expected=(0, -signal.SIGTERM),
             grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM, up to grace_s to exit, then SIGKILL to what is left of the group;
        anything unexpected (exit status, survivors, output) goes to `notes`."""
        if self in Proc.live:
            Proc.live.remove(self)
        if self.alive():
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(grace_s)
            except subprocess.TimeoutExpired:
                notes.append(f"{self.name} did not exit {grace_s:.0f} s after SIGTERM: killed")
        time.sleep(0.02)
        left = [p for p in group_members(self.pid) if p != self.pid]
        if left and self.p.poll() is not None:
            notes.append(f"{self.name} left processes after it exited: "
                         f"{[(p, ' '.join(cmdline(p))) for p in left]}")
        kill_group(self.pid)
        rc = self.p.wait(5)
        if rc not in expected:
            notes.append(f"{self.name} exit status {rc}")
        text = "\n".join(line for line in self.output().splitlines()
                         if line.strip() and self.keep(line)).strip()
        if text:
            notes.append(f"{self.name} output:\n{text[-3000:]}")
        self.out.close()

    @classmethod
    def stop_all(cls, notes: list[str]) -> None:
        for p in reversed(list(cls.live)):
            p.stop(notes, grace_s=3.0)


def _kill_live() -> None:
    for p in list(Proc.live):
        kill_group(p.pid)


def _exit_on_signal(signum, _frame):
    sys.exit(128 + signum)          # runs the finally blocks, then the atexit hook


def guard_exits() -> None:
    """Nothing a benchmark started outlives it: an atexit hook, SIGTERM and SIGHUP."""
    atexit.register(_kill_live)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)


def wait_until(ready, what: str, procs=(), cap_s: float = 30.0, step_s: float = 0.02) -> None:
    """Poll ready() (an exception counts as not yet) until true; the processes in `procs`
    must stay up meanwhile."""
    deadline = time.monotonic() + cap_s
    while True:
        for p in procs:
            p.check()
        try:
            if ready():
                return
        except Exception:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {cap_s:.0f} s")
        time.sleep(step_s)
