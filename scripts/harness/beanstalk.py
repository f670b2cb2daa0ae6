# A beanstalk-protocol server under test, and a small blocking client for set-up work.
#
# BeanstalkServer is beanstalkd, `zstalk serve` or `zstalkd` started on a fresh loopback
# port (a Proc: own session, output kept); it is ready once `list-tube-used` is answered
# `USING default`.  It remembers its children at start, so a child that died and was
# restarted by zstalk's supervisor shows up in the notes, as does anything it wrote
# beyond zstalk's start-up line and an exit status other than 0 / SIGTERM.
#
# Client is for the untimed parts (fills, stats, watching tubes): one blocking socket,
# replies cut at CRLF, RESERVED / FOUND / OK followed by their <bytes> body (beanstalkd's
# doc/protocol.txt).  The timed loads are in loadgen.py.
from __future__ import annotations

import socket
import time

from .procs import HOST, Proc, children, free_port, zstalk_keep


class BeanstalkServer:
    def __init__(self, name: str, argv_fn, kind: str = "zstalk", pdeathsig: bool = True):
        """argv_fn(port) -> the command line; kind "reference", "zstalk" or "floor" (a
        command that exits by itself, timed from exec to exit)."""
        self.name, self.argv_fn, self.kind, self.pdeathsig = name, argv_fn, kind, pdeathsig
        self.proc: Proc | None = None
        self.port = 0
        self.start_children: list[int] | None = []
        self.notes: list[str] = []
        self.output = None          # kept across a crash and a restart (binlog recovery)

    @property
    def addr(self):
        return (HOST, self.port)

    def spawn(self, port: int | None = None) -> float:
        """Start the process (on a fresh port unless given); the time just before Popen."""
        self.port = port or free_port()
        self.proc = Proc(self.name, self.argv_fn(self.port), pdeathsig=self.pdeathsig,
                         keep=zstalk_keep, output=self.output)
        self.output = self.proc.out
        self.start_children = None
        return self.proc.t_spawn

    def start(self, timeout: float = 20.0) -> float:
        """spawn() and wait until it answers; seconds from Popen to ready."""
        t0 = self.spawn()
        deadline = t0 + timeout
        while not self._answers():
            self.proc.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready after {timeout}s")
            time.sleep(0.01)
        self.start_children = sorted(children(self.proc.pid))
        return time.monotonic() - t0

    def _answers(self) -> bool:
        try:
            with socket.create_connection(self.addr, timeout=0.5) as s:
                s.sendall(b"list-tube-used\r\n")
                got = b""
                while not got.endswith(b"\r\n"):
                    chunk = s.recv(100)
                    if not chunk:
                        break
                    got += chunk
                return got == b"USING default\r\n"
        except OSError:
            return False

    def pids(self) -> list[int]:
        return self.proc.pids() if self.proc else []

    def cpu_s(self) -> float:
        return self.proc.cpu_s() if self.proc else 0.0

    def rss_mib(self) -> float:
        return self.proc.rss_mib() if self.proc else 0.0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def check_children(self, where: str) -> None:
        if self.kind != "zstalk" or not self.alive():
            return
        now = sorted(children(self.proc.pid))
        if self.start_children is None:
            self.start_children = now
        elif now != self.start_children:
            self.notes.append(f"{where}: {self.name} children changed {self.start_children}"
                              f" -> {now} (a child died and was restarted?)")
            self.start_children = now

    def stop(self, where: str = "stop") -> list[str]:
        """Stop it; the notes gathered over its life (and this stop), prefixed by `where`."""
        if self.proc is not None:
            self.check_children(where)
            if self.kind != "floor" and not self.alive():
                self.notes.append(f"{where}: {self.name} exited (rc={self.proc.p.returncode})")
            stop_notes: list[str] = []
            self.proc.stop(stop_notes)
            self.notes += [f"{where}: {n}" for n in stop_notes]
            self.proc, self.output = None, None
        notes, self.notes = self.notes, []
        return notes


class Client:
    def __init__(self, addr, timeout: float = 15.0):
        self.sock = socket.create_connection(addr, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()

    def close(self, patience: float = 1.0) -> bool:
        """Half-close, read to EOF, close: no RST for replies still in flight."""
        ok = True
        try:
            self.sock.settimeout(patience)
            try:
                self.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            while self.sock.recv(65536):
                pass
        except OSError:
            ok = False
        finally:
            self.sock.close()
        return ok

    def send(self, data: bytes):
        self.sock.sendall(data)

    def _fill(self):
        d = self.sock.recv(65536)
        if not d:
            raise EOFError("server closed the connection")
        self.buf += d

    def line(self) -> bytes:
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                out = bytes(self.buf[:i])
                del self.buf[:i + 2]
                return out
            self._fill()

    def reply(self):
        line = self.line()
        if line.startswith((b"RESERVED ", b"FOUND ", b"OK ")):
            n = int(line.rsplit(b" ", 1)[1])
            while len(self.buf) < n + 2:
                self._fill()
            body = bytes(self.buf[:n])
            del self.buf[:n + 2]
            return line, body
        return line, None

    def expect(self, prefix: bytes):
        line, body = self.reply()
        if not line.startswith(prefix):
            raise RuntimeError(f"expected {prefix!r}, got {line!r}")
        return line, body

    def pipeline(self, cmds: list[bytes], replies_per_cmd: int = 1, batch: int = 500,
                 expect: bytes | None = None) -> list[bytes]:
        """Send commands in pipelined batches; return the reply lines."""
        lines = []
        for i in range(0, len(cmds), batch):
            part = cmds[i:i + batch]
            self.send(b"".join(part))
            for _ in range(len(part) * replies_per_cmd):
                line, _ = self.reply()
                lines.append(line)
        if expect is not None:
            bad = [l for l in lines if not l.startswith(expect)]
            if bad:
                raise RuntimeError(f"unexpected replies: {bad[:3]!r} ({len(bad)} total)")
        return lines

    def stats(self, cmd: bytes = b"stats") -> dict:
        self.send(cmd + b"\r\n")
        line, body = self.reply()
        if not line.startswith(b"OK"):
            raise RuntimeError(f"{cmd!r}: {line!r}")
        out = {}
        for l in body.decode().splitlines():
            if ":" in l:
                k, v = l.split(":", 1)
                out[k.strip()] = v.strip()
        return out


def stats_of(addr, timeout: float = 15.0) -> dict:
    """One `stats` on a connection of its own."""
    c = Client(addr, timeout=timeout)
    try:
        return c.stats()
    finally:
        c.close()


def close_all(clients) -> None:
    for c in clients:
        try:
            c.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
    patience = 1.0
    for c in clients:
        if not c.close(patience):
            patience = 0.01
