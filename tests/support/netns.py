"""Hosts for multi-host tests: Linux network namespaces on one bridge, made and removed here.

A `Lan` is a namespace holding a bridge (`br0`); each `Lan.host(name)` is another namespace
with its loopback up and one veth `eth0` plugged into that bridge, addressed 10.77.0.N/24.
Nothing is added to the machine's own network namespace, so a test cannot disturb the
machine's network, and every address a test uses is inside namespaces it made itself.

Code reaches a host in two ways:
  * `host.exec(argv)` / `host.popen(argv)`: a process in the namespace (`ip netns exec`);
  * `with host.inside():` the calling thread enters the namespace (setns(2)) and leaves it
    at the end.  A socket belongs to the namespace it was created in, for its whole life,
    so a client connected inside the block (greenstalk, http.client, a listening socket)
    keeps talking from that host after the block; only the thread is moved back.
    Libraries that create their sockets on other threads (ZeroMQ's I/O threads) must run
    in a process instead.

`with Lan() as lan:` removes it all at the end.  `host.cut()` sets the host's eth0 down (a pulled cable: packets are dropped, nobody is told);
`host.mend()` sets it up again.  `Lan.close()` deletes every namespace; processes still
inside one keep running in it, so callers stop theirs first.

Needs root and iproute2 (`ip`, in scripts/test's image group); `netns_missing()` says why not
(ZSTALK_TEST_SKIP=image too), for a skip or a CI failure.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
from typing import Iterator, Sequence

from servers import group_missing, group_skipped

CLONE_NEWNET = 0x40000000
SUBNET = "10.77.0"
_libc = ctypes.CDLL(None, use_errno=True)


def netns_missing() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if os.geteuid() != 0 and not group_skipped("image"):
        return "network namespaces need root"
    missing = group_missing("image", ["ip"])
    if missing:
        return missing
    probe = f"zs-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


class Host:
    def __init__(self, lan: "Lan", name: str, number: int) -> None:
        self.lan = lan
        self.name = name
        self.ns = f"{lan.prefix}-{name}"
        self.address = f"{SUBNET}.{number}"

    @property
    def path(self) -> str:
        return f"/var/run/netns/{self.ns}"

    def _plug(self) -> None:
        _ip("netns", "add", self.ns)
        _ip("-n", self.lan.ns, "link", "add", "name", self.name, "type", "veth",
            "peer", "name", "eth0", "netns", self.ns)
        _ip("-n", self.lan.ns, "link", "set", "dev", self.name, "master", "br0", "up")
        _ip("-n", self.ns, "addr", "add", f"{self.address}/24", "dev", "eth0")
        _ip("-n", self.ns, "link", "set", "dev", "lo", "up")
        _ip("-n", self.ns, "link", "set", "dev", "eth0", "up")

    def argv(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *argv]

    def exec(self, argv: Sequence[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(argv), capture_output=True, text=True, timeout=timeout,
                              **kwargs)

    def popen(self, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.argv(argv), **kwargs)

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        """Run the block's own thread in this host's namespace."""
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(self.path, os.O_RDONLY)
        try:
            _setns(target)
            try:
                yield
            finally:
                _setns(home)
        finally:
            os.close(target)
            os.close(home)

    def cut(self) -> None:
        _ip("-n", self.ns, "link", "set", "dev", "eth0", "down")

    def mend(self) -> None:
        _ip("-n", self.ns, "link", "set", "dev", "eth0", "up")


class Lan:
    """A bridge in a namespace of its own, and the hosts plugged into it."""

    def __init__(self, prefix: str | None = None) -> None:
        self.prefix = prefix or f"zs{os.getpid()}"
        self.ns = f"{self.prefix}-lan"
        self.hosts: dict[str, Host] = {}
        _ip("netns", "add", self.ns)
        _ip("-n", self.ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.ns, "link", "set", "br0", "up")

    def host(self, name: str) -> Host:
        """A new host on this bridge, 10.77.0.(10 + its rank)."""
        host = Host(self, name, 10 + len(self.hosts))
        self.hosts[name] = host
        host._plug()
        return host

    def __enter__(self) -> "Lan":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        for ns in [h.ns for h in self.hosts.values()] + [self.ns]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.hosts.clear()
