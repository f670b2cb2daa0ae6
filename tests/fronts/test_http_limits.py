"""The HTTP front's own limits (protocol/fronts/http/site.py): TLS, the header and body timeouts
against slow clients, the connection limit.

Each rule is checked in process, with the harness of test_http_front.py (a FakeLink for
the broker) and raw sockets as the slow clients; the command line and its wiring with
real `zstalk` processes on loopback: start errors, and TLS and the limits through
`zstalk serve` in one process and under the supervisor."""
from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import ssl
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest
import trustme

from servers import LOOPBACK, find_zstalk, self_check
from test_http_front import FakeLink, enqueued, listening_socket
from test_tasks_end_to_end import host, serve  # noqa: F401 (fixtures)
from test_tasks_supervised import child
from zstalk.protocol.fronts.http.front import HttpFront
from zstalk.protocol.network.listen import HttpLimits, TlsError, tls_context

SHORT_S = 1.0               # the timeouts under test
CUT_WITHIN_S = 5.0          # ... and how late a cut may come on a busy machine
WAIT_S = 10.0
GET = b"GET /v1/openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
ENQUEUE = (b'POST /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\n'
           b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"function"')
needs_zstalk = pytest.mark.skipif(self_check(), reason="needs zstalk")


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls_files(tmp_path: Path, ca: trustme.CA) -> tuple[str, str]:
    """A certificate for 127.0.0.1 from the test CA: (chain file, key file)."""
    leaf = ca.issue_cert(LOOPBACK, "localhost")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    for blob in leaf.cert_chain_pems:
        blob.write_to_path(str(cert), append=True)
    leaf.private_key_pem.write_to_path(str(key))
    return str(cert), str(key)


@pytest.fixture
def client_tls(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


@contextlib.asynccontextmanager
async def serving(limits: HttpLimits = HttpLimits(), tls=None):
    """A front with `limits` (and TLS) on 127.0.0.1, the broker a FakeLink that takes
    every enqueue: its port and the link."""
    link = FakeLink(enqueued)
    front = HttpFront("tcp://127.0.0.1:1", link=link, limits=limits, tls=tls)
    link.front = front
    sock = listening_socket()
    await front.start([sock])
    try:
        yield sock.getsockname()[1], link
    finally:
        await front.close()


async def get(reader, writer) -> int:
    """One GET on an open connection, which stays open: the status answered."""
    writer.write(GET)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    length = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", head).group(1))
    await asyncio.wait_for(reader.readexactly(length), WAIT_S)
    return int(head.split()[1])


async def enqueue(port: int) -> int:
    """A whole POST /v1/tasks from a client of its own: its status."""
    async with aiohttp.ClientSession() as client:
        async with client.post(f"http://{LOOPBACK}:{port}/v1/tasks",
                               json={"function": "hello"}) as response:
            return response.status


async def stall(port: int, sent: bytes = b""):
    """A connection that sends `sent` and then nothing: (reader, writer, when).  Keep the
    writer: dropping it closes the connection."""
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    writer.write(sent)
    return reader, writer, time.monotonic()


async def cut_off(reader, since: float) -> bytes:
    """What the server still sends before it closes the connection, which it must do
    after the SHORT_S timeout and within CUT_WITHIN_S of `since`."""
    data = await asyncio.wait_for(reader.read(), CUT_WITHIN_S + SHORT_S)
    assert SHORT_S * 0.9 <= time.monotonic() - since < CUT_WITHIN_S
    return data


async def rest_of(reader) -> bytes:
    """All the server sends until it closes the connection (nothing, if it resets it)."""
    try:
        return await asyncio.wait_for(reader.read(), WAIT_S)
    except ConnectionResetError:
        return b""


# -- TLS ---------------------------------------------------------------------------------
def test_a_request_over_tls_is_answered_and_plain_http_to_the_tls_port_is_not(
        tls_files, client_tls):
    async def main():
        async with serving(tls=tls_context(*tls_files)) as (port, _):
            async with aiohttp.ClientSession() as client:
                async with client.get(f"https://{LOOPBACK}:{port}/v1/openapi.json",
                                      ssl=client_tls) as response:
                    assert response.status == 200
                    assert (await response.json())["openapi"].startswith("3.1")
            reader, writer, _ = await stall(port, GET)
            assert not (await rest_of(reader)).startswith(b"HTTP/")
    asyncio.run(main())


def test_the_tls_context_takes_tls_1_2_and_later_only(tls_files):
    assert tls_context(*tls_files).minimum_version == ssl.TLSVersion.TLSv1_2


@pytest.mark.parametrize("cert, key, says", [
    ("nosuch.pem", "key.pem", "--tls-cert nosuch.pem: No such file"),
    ("junk.pem", "key.pem", "--tls-cert junk.pem: no PEM certificate"),
    ("cert.pem", "other.pem", "--tls-key other.pem is not the key of the certificate"),
    ("cert.pem", "cert.pem", "--tls-key cert.pem: no PEM private key"),
])
def test_a_tls_file_that_cannot_be_used_is_an_error_naming_it(
        tmp_path, monkeypatch, ca, tls_files, cert, key, says):
    (tmp_path / "junk.pem").write_text("not pem\n")
    ca.issue_cert("elsewhere.example").private_key_pem.write_to_path(str(tmp_path / "other.pem"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TlsError, match=re.escape(says)):
        tls_context(cert, key)


def test_a_tls_handshake_that_never_starts_is_cut_off_at_the_header_timeout(tls_files):
    async def main():
        limits = HttpLimits(header_timeout_s=SHORT_S)
        async with serving(limits, tls_context(*tls_files)) as (port, _):
            reader, writer, start = await stall(port)
            await cut_off(reader, start)
    asyncio.run(main())


# -- read timeouts -------------------------------------------------------------------------
def test_a_client_that_stalls_in_its_headers_is_cut_off_while_another_is_served():
    async def main():
        async with serving(HttpLimits(header_timeout_s=SHORT_S)) as (port, link):
            reader, writer, start = await stall(port, b"POST /v1/tasks HTTP/1.1\r\n"
                                                 b"Host: 127.0.0.1\r\n")     # and no more
            assert await enqueue(port) == 201
            assert await cut_off(reader, start) == b""
            assert len(link.requests) == 1
    asyncio.run(main())


def test_headers_trickling_in_a_byte_at_a_time_are_cut_off_at_the_header_timeout_all_the_same():
    async def main():
        async with serving(HttpLimits(header_timeout_s=SHORT_S)) as (port, _):
            reader, writer, start = await stall(port)
            closed = asyncio.ensure_future(cut_off(reader, start))
            for byte in b"GET /v1/openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: yes":
                if closed.done():
                    break
                writer.write(bytes([byte]))
                await asyncio.sleep(0.1)
            assert await closed == b""
    asyncio.run(main())


def test_the_header_timeout_counts_from_the_previous_response_on_a_kept_alive_connection():
    async def main():
        async with serving(HttpLimits(header_timeout_s=SHORT_S)) as (port, _):
            reader, writer = await asyncio.open_connection(LOOPBACK, port)
            statuses = []
            for _ in range(4):          # 2.4 s on one connection, 0.6 s between requests
                statuses.append(await get(reader, writer))
                await asyncio.sleep(SHORT_S * 0.6)
            assert statuses == [200] * 4
    asyncio.run(main())


def test_a_client_that_stalls_in_its_body_gets_a_408_and_is_closed_while_another_is_served():
    async def main():
        async with serving(HttpLimits(body_timeout_s=SHORT_S)) as (port, link):
            reader, writer, start = await stall(port, ENQUEUE)     # 11 bytes of a 100-byte body
            assert await enqueue(port) == 201
            head, _, body = (await cut_off(reader, start)).partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408 ") and b"Connection: close" in head
            assert json.loads(body)["error"] == "request_timeout"
            assert len(link.requests) == 1      # the stalled task was not enqueued
    asyncio.run(main())


# -- the connection limit --------------------------------------------------------------------
def test_beyond_the_connection_limit_a_new_connection_is_closed_and_the_first_ones_still_work():
    async def main():
        async with serving(HttpLimits(max_connections=3)) as (port, _):
            first = [await asyncio.open_connection(LOOPBACK, port) for _ in range(3)]
            assert [await get(r, w) for r, w in first] == [200] * 3
            reader, writer, _ = await stall(port, GET)
            assert await rest_of(reader) == b""
            assert [await get(r, w) for r, w in first] == [200] * 3
            first[0][1].close()             # one leaves: a new connection is taken again
            deadline = time.monotonic() + WAIT_S
            while True:
                reader, writer = await asyncio.open_connection(LOOPBACK, port)
                try:
                    assert await get(reader, writer) == 200
                    break
                except (asyncio.IncompleteReadError, ConnectionResetError):
                    assert time.monotonic() < deadline, "no connection taken after one left"
                    await asyncio.sleep(0.05)
    asyncio.run(main())


# -- the command line, with real processes ---------------------------------------------------
@needs_zstalk
@pytest.mark.parametrize("give, says", [
    (["--tls-cert", "CERT"], "--tls-key is missing"),
    (["--tls-key", "KEY"], "--tls-cert is missing"),
    (["--tls-cert", "CERT", "--tls-key", "nosuch.pem"], "--tls-key nosuch.pem: No such file"),
])
@pytest.mark.parametrize("command", [
    ["front", "http", "--listen", f"{LOOPBACK}:0"],
    ["serve", "-l", LOOPBACK, "-p", "0", "--counter-port", "0", "--worker-bind", "none"],
])
def test_a_missing_or_bad_tls_file_stops_the_http_front_and_serve_at_start_with_exit_2(
        tmp_path, tls_files, command, give, says):
    files = {"CERT": tls_files[0], "KEY": tls_files[1]}
    out = subprocess.run([find_zstalk(), *command, *[files.get(word, word) for word in give]],
                         capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert out.returncode == 2 and says in out.stderr


def assert_stalled_tls_client_is_cut(base: str) -> None:
    """A TLS client that sends half its headers is closed within the header timeout."""
    host_, port = base.removeprefix("https://").split(":")
    insecure = ssl.create_default_context()
    insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection((host_, int(port)), timeout=WAIT_S) as raw:
        with insecure.wrap_socket(raw) as tls:
            start = time.monotonic()
            tls.sendall(b"GET /v1/openapi.json HTTP/1.1\r\n")
            tls.settimeout(CUT_WITHIN_S + SHORT_S)
            try:
                rest = tls.recv(100)
            except (ssl.SSLError, ConnectionResetError):     # closed without close_notify
                rest = b""
            assert rest == b""
            assert SHORT_S * 0.9 <= time.monotonic() - start < CUT_WITHIN_S


@needs_zstalk
def test_serve_serves_the_api_over_tls_says_https_and_cuts_off_a_stalled_client(
        serve, host, tls_files, client_tls):
    api = serve("--tls-cert", tls_files[0], "--tls-key", tls_files[1],
                "--http-header-timeout", str(SHORT_S), client_tls=client_tls)
    code, body = api.enqueue("closeOrder", {"id": 7})
    assert code == 201 and api.wait_status(body["uniqueId"], "success")["result"]
    assert f"https on {api.base.removeprefix('https://')}" in api.server.output()
    assert_stalled_tls_client_is_cut(api.base)


@needs_zstalk
def test_serve_with_fronts_gives_its_http_front_child_the_tls_files_and_limits_by_name(
        serve, host, tls_files, client_tls):
    api = serve("--fronts", "1", "--tls-cert", tls_files[0], "--tls-key", tls_files[1],
                "--http-header-timeout", str(SHORT_S), "--http-max-connections", "7",
                client_tls=client_tls)
    code, body = api.enqueue("closeOrder", {"id": 8})
    assert code == 201 and api.wait_status(body["uniqueId"], "success")["result"]
    front = child(api.server.pid, "front", "http")
    argv = Path(f"/proc/{front}/cmdline").read_bytes().decode().split("\0")
    assert argv[argv.index("--tls-cert") + 1] == tls_files[0]
    assert argv[argv.index("--max-connections") + 1] == "7"
    assert "BEGIN" not in " ".join(argv)            # names, not contents
    assert_stalled_tls_client_is_cut(api.base)

