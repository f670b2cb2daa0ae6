"""`zstalk top` in a real terminal: tmux (scripts/test's terminal group) runs it against a real
`zstalk serve` with tubes, functions and a counter, and against Debian's beanstalkd; the test
reads the screen with `capture-pane` and types with `send-keys`, as a person would."""
from __future__ import annotations

import os
import shlex
import subprocess
import uuid
from pathlib import Path

import pytest

from servers import LOOPBACK, find_zstalk, free_port, needs_group, wait_for
from test_operator_end_to_end import KEY, host, server  # noqa: F401  (fixtures)
from test_operator_views_end_to_end import put

WAIT_S = 15.0
#: where ZSTALK_DOCS_SHOTS=1 saves the screen the docs show (docs/operations/operator.md)
SHOT = Path(__file__).resolve().parents[2] / "docs" / "operations" / "top-screen.txt"


class Terminal:
    """One tmux server of its own (-L: no other session is touched), one 120x40 window (curses
    would take a COLUMNS or LINES inherited from the test over the window's size: unset)."""

    def __init__(self, *argv: str) -> None:
        self.tmux = needs_group("terminal", "tmux")
        self.socket = f"zstalk-top-{uuid.uuid4().hex[:8]}"
        self.run("new-session", "-d", "-s", "top", "-x", "120", "-y", "40",
                 "env -u COLUMNS -u LINES TERM=xterm " + shlex.join(argv) + "; sleep 30")

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([self.tmux, "-L", self.socket, "-f", "/dev/null", *args],
                              capture_output=True, text=True, timeout=30)

    def screen(self) -> list[str]:
        return self.run("capture-pane", "-p", "-t", "top").stdout.splitlines()

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", "top", *keys)

    def rows(self, first: str) -> list[list[str]]:
        """The rows under the header that starts with `first`, as words."""
        lines = self.screen()
        start = next((i for i, text in enumerate(lines) if text.split()[:1] == [first]), None)
        if start is None:
            return []
        rows = []
        for text in lines[start + 1:]:
            if not text.strip():
                break
            rows.append(text.split())
        return rows

    def shows(self, predicate) -> bool:
        return wait_for(predicate, WAIT_S)

    def close(self) -> None:
        self.run("kill-server")


@pytest.fixture
def terminal():
    made: list[Terminal] = []

    def start(*argv: str) -> Terminal:
        made.append(Terminal(*argv))
        return made[-1]
    yield start
    for t in made:
        t.close()


def test_top_shows_tubes_functions_counters_and_peers_busiest_first_and_sorts_and_filters(
        server, host, terminal):  # noqa: F811  (pytest's fixtures)
    address = server.server.address
    put(address, "quiet", b"1")
    put(address, "busy", b"1", b"2", b"3")
    host.held.add("resize")
    for function, options in (("reports", {"delay": 600000}), ("reports", {"delay": 600000}),
                              ("resize", {})):
        assert server.enqueue(function, None, **options)[0] == 201
    screen = terminal(find_zstalk(), "top", "--url", server.base, "--master-key", KEY)
    assert screen.shows(lambda: [r[:2] for r in screen.rows("TUBE")][:2] == [
        ["busy", "3"], ["quiet", "1"]]), "\n".join(screen.screen())
    header = next(text.split() for text in screen.screen() if text.startswith("TUBE"))
    oldest = header.index("OLDEST")         # ("OLDEST MS": two words, the last before it)
    assert screen.shows(lambda: any(r[0] == "busy" and r[oldest].isdigit() and int(r[oldest]) > 0
                                    for r in screen.rows("TUBE"))), "\n".join(screen.screen())
    assert screen.shows(lambda: ["reports", "2", "0", "2"] in [
        r[:4] for r in screen.rows("FUNCTION")]), "\n".join(screen.screen())
    assert screen.shows(lambda: ["resize", "0", "1"] in [r[:3] for r in screen.rows("FUNCTION")])
    assert screen.shows(lambda: {"beanstalk", "dispatcher", "http"} <= {
        r[0] for r in screen.rows("PEER")}), "\n".join(screen.screen())  # (the server's fronts)
    assert "sort: activity" in screen.screen()[0]
    if os.environ.get("ZSTALK_DOCS_SHOTS") == "1":
        shown = "\n".join(screen.screen()).rstrip().replace(server.base, "http://127.0.0.1:8080")
        SHOT.write_text(shown + "\n")

    put(address, "quiet", *[b"x"] * 5)                  # (quiet moves now: it comes first)
    assert screen.shows(lambda: [r[0] for r in screen.rows("TUBE")][:1] == ["quiet"]), \
        "\n".join(screen.screen())
    screen.keys("s")                                    # by name
    assert screen.shows(lambda: [r[0] for r in screen.rows("TUBE")] == [
        "busy", "default", "quiet"]), "\n".join(screen.screen())
    screen.keys("/", "qu", "Enter")
    assert screen.shows(lambda: [r[0] for r in screen.rows("TUBE")] == ["quiet"])
    assert "filter: qu" in screen.screen()[0]
    screen.keys("q")
    assert screen.shows(lambda: not any("zstalk top" in text for text in screen.screen()))
    host.held.clear()


def test_top_reads_debians_beanstalkd_and_its_rates(beanstalkd_server, terminal):
    address = beanstalkd_server.address
    put(address, "emails", b"1", b"2", b"3")
    screen = terminal(find_zstalk(), "top", "--beanstalk", "%s:%d" % address)
    assert screen.shows(lambda: ["emails", "3", "0", "0", "0", "3"] in [
        r[:6] for r in screen.rows("TUBE")]), "\n".join(screen.screen())
    assert not screen.rows("FUNCTION")
    assert [r[8] for r in screen.rows("TUBE") if r[0] == "emails"] == ["-"], \
        "stats-tube has no oldest ready age"
    put(address, "emails", *[b"x"] * 20)
    assert screen.shows(lambda: any(r[0] == "emails" and float(r[6]) > 0
                                    for r in screen.rows("TUBE"))), "\n".join(screen.screen())
    screen.keys("q")
    assert screen.shows(lambda: not any("zstalk top" in text for text in screen.screen()))


def test_top_out_of_reach_exits_3_before_taking_the_terminal():
    port = free_port()
    done = subprocess.run([find_zstalk(), "top", "--beanstalk", f"{LOOPBACK}:{port}"],
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert done.returncode == 3 and f"{LOOPBACK}:{port}" in done.stderr
