"""File-system work of the binlog: preallocating segments, and the fsync thread.

`preallocate` reserves a segment's blocks up front (posix_fallocate; zeros written on
file systems without it), so writing into the segment later cannot fail for space.

`Syncer` runs fsync off the event loop: the loop hands it the file descriptors written
since the last sync and the write number they cover; when the fsyncs return, the thread
records that number and writes a byte to a pipe the loop polls, so the loop learns of
it without waiting.  One sync runs at a time; writes made meanwhile are covered by the
next one (group commit).  The thread also keeps how long each sync took (`take_done`
hands them to the loop, for the fsync latency histogram).
"""
from __future__ import annotations

import errno
import os
import threading
import time


def preallocate(fd: int, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        zeros = bytes(65536)            # file systems without fallocate: write zeros
        for off in range(0, size, len(zeros)):
            os.pwrite(fd, zeros[:min(len(zeros), size - off)], off)


class Syncer:
    """The fsync thread: runs one requested sync at a time and signals a pipe when done."""

    def __init__(self) -> None:
        self.read_fd, self._write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        self._cond = threading.Condition()
        self._job: tuple | None = None
        self._done = 0
        self._error: OSError | None = None
        self._took: list[float] = []        # seconds each sync took, since take_done
        self.busy = False
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="zstalk-fsync", daemon=True)
        self._thread.start()

    def request(self, seq: int, fds: list[int], dir_fd: int) -> None:
        with self._cond:
            self.busy = True
            self._job = (seq, fds, dir_fd)
            self._cond.notify()

    def take_done(self) -> tuple[int, OSError | None, list[float]]:
        """The last write number synced, the error that stopped the thread (if any), and
        how long each sync since the last call took."""
        try:
            os.read(self.read_fd, 4096)
        except BlockingIOError:
            pass
        with self._cond:
            took, self._took = self._took, []
            return self._done, self._error, took

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._job is None and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                seq, fds, dir_fd = self._job
                self._job = None
            started = time.monotonic()
            try:
                for fd in fds:
                    os.fsync(fd)
                if dir_fd >= 0:
                    os.fsync(dir_fd)
            except OSError as exc:      # reported to the loop, which stops the broker
                with self._cond:
                    self._error = exc
                os.write(self._write_fd, b"x")
                return
            with self._cond:
                self._done = seq
                self._took.append(time.monotonic() - started)
                self.busy = False
            os.write(self._write_fd, b"x")

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(5.0)
        os.close(self.read_fd)
        os.close(self._write_fd)
