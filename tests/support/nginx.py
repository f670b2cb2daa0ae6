# nginx as a reference server, and recording HTTP backends to put behind it.
#
# start_nginx(tmp, {"backend": block}) runs Debian's nginx (1.22) on a free loopback
# port with `worker_processes 1` (open-source nginx keeps balancer state per worker
# unless a `zone` is set, so one worker is the one view zstalk has), `daemon off`, a
# prefix and config of its own under `tmp` and its error log there.  Each upstream NAME
# is served at /NAME/ by proxy_pass, one attempt per request (`proxy_next_upstream off`
# unless the location says otherwise), HTTP/1.1 with keep-alive to the backends, and
# the answer carries `X-Upstream: $upstream_addr`, the peer nginx chose.
#
# upstream_block(spec) writes an upstream spec of zstalk.broker.core.upstreams (read by
# attribute only, so this file imports no zstalk module) as nginx's `upstream` block.
#
# Backend(name) is a tiny HTTP/1.1 server on 127.0.0.1 (port 0: no race for the port)
# in a thread: every request is recorded and answered 200 with the backend's name, or
# with what its `reply` callable says.
#
# Client(address) is one keep-alive connection, optionally from a given source address
# (the loopback /8 accepts any 127.a.b.c as a source on Linux).
from __future__ import annotations

import http.client
import http.server
import threading
from pathlib import Path
from typing import Callable, Iterable, Mapping, NamedTuple

from servers import LOOPBACK, ServerProcess, free_port, needs_group, start_on_a_free_port

NGINX_CONF = """\
worker_processes 1;
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
{http}
    server {{
        listen {host}:{port};
{locations}
    }}
}}
"""

PROXY_LOCATION = """\
        location /{name}/ {{
            proxy_pass http://{name};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_next_upstream {next_upstream};
            add_header X-Upstream $upstream_addr always;
{extra}
        }}
"""


def require_nginx() -> str:
    """Path of the nginx binary (Debian installs it in /usr/sbin, not on every PATH)."""
    return needs_group("reference", "nginx")


def upstream_block(name: str, spec, hash_key: str = "$arg_key") -> str:
    """nginx's `upstream NAME { ... }` for a zstalk upstream spec; the hash key selector
    becomes the nginx variable `hash_key`."""
    method = {"round_robin": "", "least_conn": "least_conn;", "ip_hash": "ip_hash;",
              "hash": f"hash {hash_key}{' consistent' if spec.consistent else ''};",
              "random": "random two;" if spec.two else "random;"}[spec.balance]
    lines = [f"upstream {name} {{", f"    {method}"]
    for server in spec.servers:
        assert float(server.fail_timeout_s).is_integer(), "nginx counts fail_timeout in seconds"
        params = [f"weight={server.weight}", f"max_fails={server.max_fails}",
                  f"fail_timeout={int(server.fail_timeout_s)}s"]
        params += [f"max_conns={server.max_conns}"] * bool(server.max_conns)
        params += ["backup"] * server.backup + ["down"] * server.down
        lines.append(f"    server {server.server} {' '.join(params)};")
    return "\n".join(lines + ["}"])


class Nginx(ServerProcess):
    """nginx under test: `prefix` holds its config and error log."""

    def __init__(self, binary: str, prefix: Path, conf: str, port: int) -> None:
        (prefix / "nginx.conf").write_text(conf)
        super().__init__([binary, "-p", f"{prefix}/", "-c", f"{prefix}/nginx.conf",
                          "-e", f"{prefix}/error.log"], (LOOPBACK, port), name="nginx")
        self.prefix = prefix

    def error_log(self) -> str:
        path = self.prefix / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def output(self) -> str:
        return super().output() + self.error_log()


def start_nginx(tmp: Path, upstreams: Mapping[str, str], *, next_upstream: str = "off",
                location_extra: str = "", http_extra: str = "") -> Nginx:
    """nginx with these upstream blocks (name -> block text), each proxied at /NAME/."""
    binary = require_nginx()
    locations = "".join(PROXY_LOCATION.format(name=name, next_upstream=next_upstream,
                                              extra=location_extra) for name in upstreams)
    http = "\n".join([*upstreams.values(), http_extra])

    def build() -> Nginx:
        port = free_port()
        prefix = tmp / f"nginx-{port}"
        prefix.mkdir(parents=True, exist_ok=True)
        conf = NGINX_CONF.format(prefix=prefix, http=http, host=LOOPBACK, port=port,
                                 locations=locations)
        return Nginx(binary, prefix, conf, port)
    return start_on_a_free_port(build)


class Recorded(NamedTuple):
    """One request a backend received."""
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    client: tuple[str, int]


class Reply(NamedTuple):
    status: int
    headers: dict[str, str]
    body: bytes


class Backend:
    """A recording HTTP/1.1 server on 127.0.0.1 (or `address`: (host, port)) that answers
    with its name."""

    def __init__(self, name: str, reply: Callable[[Recorded], Reply] | None = None,
                 address: tuple[str, int] = (LOOPBACK, 0)) -> None:
        self.name = name
        self.reply = reply or (lambda request: Reply(200, {}, name.encode()))
        self.requests: list[Recorded] = []
        self._server = http.server.ThreadingHTTPServer(address, _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"backend-{name}",
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        return self._server.server_address[:2]

    @property
    def server(self) -> str:
        """host:port, as an nginx `server` line and a zstalk url after the scheme."""
        return f"{self.address[0]}:{self.address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def _handler(backend: Backend) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"       # keep-alive, as nginx's upstream keepalive wants

        def answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            request = Recorded(self.command, self.path, dict(self.headers.items()),
                               self.rfile.read(length), self.client_address[:2])
            backend.requests.append(request)
            reply = backend.reply(request)
            self.send_response(reply.status)
            for key, value in reply.headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = answer

        def log_message(self, format: str, *args) -> None:
            pass
    return Handler


def start_backends(names: Iterable[str]) -> list[Backend]:
    return [Backend(name) for name in names]


class Client:
    """One keep-alive HTTP connection to `address`, from `source` if given."""

    def __init__(self, address: tuple[str, int], source: str | None = None, timeout: float = 5) -> None:
        self.connection = http.client.HTTPConnection(
            *address, timeout=timeout, source_address=(source, 0) if source else None)

    def get(self, path: str) -> Reply:
        self.connection.request("GET", path)
        response = self.connection.getresponse()
        return Reply(response.status, dict(response.getheaders()), response.read())

    def post(self, path: str, body: bytes = b"{}") -> Reply:
        self.connection.request("POST", path, body, {"Content-Type": "application/json"})
        response = self.connection.getresponse()
        return Reply(response.status, dict(response.getheaders()), response.read())

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
