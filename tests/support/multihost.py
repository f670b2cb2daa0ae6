"""A zstalk cluster as the production overlay's pods, for tests/deploy/test_multihost.py.

`Cluster` renders `kubectl kustomize k8s/overlays/production` and runs each pod's container
as the zstalk image in podman (tests/support/pods.py) on a host of its own: a network namespace on
one bridge (tests/support/netns.py), as pods get their own IPs.  Service names resolve to those
hosts, and the Secrets are made as k8s/README.md says (`zstalk keygen` for every role), so
CURVE is on for every link to the broker.  Clients run on the client host (`beanstalk`,
`request`), and so does the function host the rendered zstalk.toml names
(http://functions:3000), which records each call and whether its signature verified.
"""
from __future__ import annotations

import contextlib
import http.server
import json
import secrets
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import greenstalk
import pytest
import yaml

from netns import Lan
from pods import PodData, config_maps, workloads
from servers import readme_block, wait_for
from test_k8s_manifests import rendered
from zstalk.protocol.network import curve
from zstalk.workers import signing

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = "production"
PLACEMENT = {                          # host → the workload its pod runs
    "broker": "zstalk-broker",
    "front-a": "zstalk-front-beanstalk",
    "front-b": "zstalk-front-beanstalk",
    "http": "zstalk-front-http",
    "dispatcher": "zstalk-dispatcher",
    "worker": "zstalk-worker",
}
READY_S = 60.0
CLIENT_TIMEOUT_S = 30.0
WORKER_APP = '''\
"""The example worker the zstalk-worker Deployment runs: deletes every job of "emails"."""
from zstalk.workers import Worker

worker = Worker(concurrency=4)


@worker.handler("emails")
def send(job):
    pass
'''


class FunctionHost(http.server.ThreadingHTTPServer):
    """The functions' HTTP server on the client host: answers every call 200 with what it
    was given, and records the call and whether its signature verified."""

    def __init__(self, key: bytes) -> None:
        self.key, self.calls = key, []
        super().__init__(("0.0.0.0", 3000), self.Handler)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            uid = self.headers.get("X-Zstalk-Task-Id", "")
            why = signing.verify(self.server.key, self.headers.get(signing.HEADER), uid, body,
                                 time.time())
            self.server.calls.append({"path": self.path, "uid": uid, "unsigned": why})
            reply = json.dumps({"echo": json.loads(body or b"null")}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass


class Cluster:
    def __init__(self, tmp: Path, image: str, run_args: list[str], lan: Lan) -> None:
        self.tmp, self.image, self.run_args = tmp, image, run_args
        self.objects = [o for o in yaml.safe_load_all(rendered(OVERLAY)) if o]
        self.workloads = workloads(self.objects)
        self.lan = lan
        self.hosts = {name: self.lan.host(name) for name in [*PLACEMENT, "client", "stranger"]}
        self.master_key = secrets.token_urlsafe(32)
        self.metrics_token = secrets.token_urlsafe(32)
        self.signing_key = secrets.token_urlsafe(32)
        self.data = PodData(tmp, self.make_secrets(tmp / "keys"), config_maps(self.objects))
        self.services = {"zstalk-broker": self.hosts["broker"].address,
                         "functions": self.hosts["client"].address}
        self.worker_image = f"localhost/{self.lan.prefix}-workers:test"
        self.build_worker_image(tmp / "workers")
        self.functions: FunctionHost | None = None

    def make_secrets(self, keys: Path) -> dict[str, dict[str, bytes]]:
        """The Secrets k8s/README.md tells an operator to create, with fresh keys."""
        keys.mkdir(parents=True)
        for role in ("broker", "front", "dispatcher", "worker"):
            curve.keygen(str(keys), role)
        read = lambda name: (keys / name).read_bytes()
        made = {"zstalk-curve-broker": {"broker.key_secret": read("broker.key_secret")},
                "zstalk-curve-clients": {f"{r}.key": read(f"{r}.key")
                                         for r in ("front", "dispatcher", "worker")},
                "zstalk-master-key": {"master-key": self.master_key.encode()},
                "zstalk-signing-key": {"signing-key": self.signing_key.encode()},
                "zstalk-metrics-token": {"token": self.metrics_token.encode()}}
        for role in ("front", "dispatcher", "worker"):
            made[f"zstalk-curve-{role}"] = {f"{role}.key_secret": read(f"{role}.key_secret"),
                                            "broker.key": read("broker.key")}
        return made

    def build_worker_image(self, context: Path) -> None:
        """docs/kubernetes.md's Dockerfile.worker, FROM this image, with WORKER_APP as app/jobs.py."""
        (context / "app").mkdir(parents=True)
        (context / "app" / "__init__.py").write_text("")
        (context / "app" / "jobs.py").write_text(WORKER_APP)
        (context / "Dockerfile.worker").write_text(readme_block("dockerfile", "# Dockerfile.worker"))
        built = subprocess.run(["buildah", "bud", "--pull=never", "--layers=false", "-q",
                                "--build-arg", f"ZSTALK_IMAGE={self.image}", "-t", self.worker_image,
                                "-f", str(context / "Dockerfile.worker"), str(context)],
                               capture_output=True, text=True, timeout=300)
        assert built.returncode == 0, built.stderr

    # -- pods --------------------------------------------------------------------------------

    def container(self, host: str) -> str:
        return f"{self.lan.prefix}-{host}"

    def start(self, host: str) -> None:
        workload = self.workloads[PLACEMENT[host]]
        image = self.worker_image if host == "worker" else self.image
        argv = workload.run_argv(image, network=f"ns:{self.hosts[host].path}",
                                 container_name=self.container(host), services=self.services,
                                 data=self.data)
        self.run_podman(argv[0], *self.run_args, *argv[1:])

    def run_podman(self, *argv: str, timeout: float = 120) -> str:
        result = subprocess.run(["podman", *argv], capture_output=True, text=True,
                                timeout=timeout)
        assert result.returncode == 0, f"podman {' '.join(argv)}: {result.stderr}"
        return result.stdout

    def logs(self, host: str) -> str:
        result = subprocess.run(["podman", "logs", self.container(host)], capture_output=True,
                                text=True, timeout=30)
        return result.stdout + result.stderr

    def wait_ready(self, host: str, timeout: float = READY_S) -> None:
        url = self.workloads[PLACEMENT[host]].readiness_url(self.hosts[host].address)
        assert url is not None, f"{PLACEMENT[host]} has no readinessProbe"
        if not wait_for(lambda: self.get(url)[0] == 200 or not self.running(host), timeout,
                        step=0.2) or not self.running(host):
            pytest.fail(f"{host} ({PLACEMENT[host]}) not ready at {url} in {timeout} s:\n"
                        f"{self.logs(host)}")

    def running(self, host: str) -> bool:
        return self.run_podman("inspect", "-f", "{{.State.Running}}", self.container(host)).strip() == "true"

    def stop(self, host: str) -> int:
        """podman stop (SIGTERM, SIGKILL after the pod's grace period); the exit code."""
        self.run_podman("stop", "-t", str(self.workloads[PLACEMENT[host]].grace_s),
                        self.container(host), timeout=180)
        code = int(self.run_podman("inspect", "-f", "{{.State.ExitCode}}", self.container(host)))
        self.run_podman("rm", self.container(host))
        return code

    # -- from the client host ----------------------------------------------------------------

    def get(self, url: str, headers: dict | None = None) -> tuple[int, bytes]:
        return self.request("GET", url, None, headers)

    def request(self, method: str, url: str, body: dict | None = None,
                headers: dict | None = None, timeout: float = 5) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with self.hosts["client"].inside():
            try:
                with urllib.request.urlopen(req, timeout=timeout) as reply:
                    return reply.status, reply.read()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read()
            except OSError:
                return 0, b""

    def beanstalk(self, host: str, **kwargs) -> greenstalk.Client:
        """A greenstalk client on the client host, connected to the front on `host`."""
        with self.hosts["client"].inside():
            client = greenstalk.Client((self.hosts[host].address, 11300), **kwargs)
        client._sock.settimeout(CLIENT_TIMEOUT_S)      # a front that stops answering fails
        return client

    def serve_functions(self) -> FunctionHost:
        with self.hosts["client"].inside():
            self.functions = FunctionHost(self.signing_key.encode())
        threading.Thread(target=self.functions.serve_forever, daemon=True).start()
        return self.functions

    def close(self) -> None:
        """Keep each pod's log (under the test's tmp dir), remove the pods and the worker
        image; every step runs whatever the others did."""
        logs = self.tmp / "logs"
        logs.mkdir(exist_ok=True)
        for host in PLACEMENT:
            with contextlib.suppress(Exception):
                (logs / f"{host}.log").write_text(self.logs(host))
            with contextlib.suppress(Exception):
                subprocess.run(["podman", "rm", "-f", "-t", "0", self.container(host)],
                               capture_output=True, timeout=60)
        with contextlib.suppress(Exception):
            subprocess.run(["podman", "rmi", "-f", self.worker_image], capture_output=True,
                           timeout=60)
        if self.functions is not None:
            self.functions.shutdown()
            self.functions.server_close()


def drain(client: greenstalk.Client, timeout: float = 0) -> list[bytes]:
    bodies = []
    while True:
        try:
            job = client.reserve(timeout=timeout)
        except greenstalk.TimedOutError:
            return bodies
        bodies.append(job.body)
        client.delete(job)


# -- what crosses hosts --------------------------------------------------------------------


def put_through(cluster, host: str, body: bytes) -> int | None:
    """A put on a new connection to `host`'s front: the job's id, or None if refused."""
    try:
        client = cluster.beanstalk(host, use="probe")
    except (OSError, greenstalk.Error):
        return None
    try:
        return client.put(body)
    except (OSError, greenstalk.Error):
        return None
    finally:
        client.close()
