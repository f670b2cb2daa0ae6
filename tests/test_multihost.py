"""The production overlay, run as Kubernetes would run it, on hosts joined by a network.

Every zstalk process here is the zstalk image (scripts/build-image) in a podman container,
started with exactly the command, arguments, environment, mounts and security context that
`kubectl kustomize k8s/overlays/production` gives its pod (tests/pods.py), each pod on a
host of its own: a network namespace plugged into one bridge (tests/netns.py), as pods get
their own IPs.  Service names resolve to those hosts.  The Secrets are made as the k8s
README says (`zstalk keygen` for every role), so CURVE is on for every link to the broker.

  broker     the StatefulSet: `zstalk broker --binlog /data -f 0 ...`, /data kept on the host
  front-a    zstalk-front-beanstalk       front-b   zstalk-front-beanstalk (a second pod)
  http       zstalk-front-http            dispatcher  zstalk-dispatcher
  worker     zstalk-worker, in an image built FROM zstalk's with the README's
             Dockerfile.worker and this test's app/jobs.py (buildah)
  client     producers and consumers (greenstalk, HTTP), and the function host the rendered
             zstalk.toml names (http://functions:3000)
  stranger   a host without any key

The module's tests share one cluster and run in order: the outage and restart tests leave it
whole again for the ones after.  Needs root, iproute2 and podman: without them it skips,
except under CI=true, where it fails.
"""
from __future__ import annotations

import http.server
import json
import re
import secrets
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import greenstalk
import pytest
import yaml

from netns import Lan, netns_missing
from image import podman_args, require_image, zstalk_image
from pods import PodData, config_maps, workloads
from servers import reference_required, wait_for
from test_k8s_manifests import rendered
from zstalk.protocol import curve
from zstalk.workers import signing

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
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
WORKER_APP = '''\
"""The example worker the zstalk-worker Deployment runs: deletes every job of "emails"."""
from zstalk.workers import Worker

worker = Worker(concurrency=4)


@worker.handler("emails")
def send(job):
    pass
'''


def readme_block(language: str, marker: str) -> str:
    found = [b for b in re.findall(rf"```{language}\n(.*?)```", README, re.S) if marker in b]
    assert len(found) == 1, f"one README {language} block holds {marker!r}"
    return found[0]


def unavailable(reason: str):
    if reference_required():
        pytest.fail(f"{reason} (CI=true: the multi-host test must run)")
    pytest.skip(reason)


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
    def __init__(self, tmp: Path, image: str, run_args: list[str]) -> None:
        self.tmp, self.image, self.run_args = tmp, image, run_args
        self.objects = [o for o in yaml.safe_load_all(rendered(OVERLAY)) if o]
        self.workloads = workloads(self.objects)
        self.lan = Lan()
        self.hosts = {name: self.lan.host(name) for name in [*PLACEMENT, "client", "stranger"]}
        self.master_key = secrets.token_urlsafe(32)
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
            curve.keygen(str(keys, ), role)
        read = lambda name: (keys / name).read_bytes()
        made = {"zstalk-curve-broker": {"broker.key_secret": read("broker.key_secret")},
                "zstalk-curve-clients": {f"{r}.key": read(f"{r}.key")
                                         for r in ("front", "dispatcher", "worker")},
                "zstalk-master-key": {"master-key": self.master_key.encode()},
                "zstalk-signing-key": {"signing-key": self.signing_key.encode()}}
        for role in ("front", "dispatcher", "worker"):
            made[f"zstalk-curve-{role}"] = {f"{role}.key_secret": read(f"{role}.key_secret"),
                                            "broker.key": read("broker.key")}
        return made

    def build_worker_image(self, context: Path) -> None:
        """The README's Dockerfile.worker, FROM this image, with WORKER_APP as app/jobs.py."""
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
                headers: dict | None = None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with self.hosts["client"].inside():
            try:
                with urllib.request.urlopen(req, timeout=5) as reply:
                    return reply.status, reply.read()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read()
            except OSError:
                return 0, b""

    def beanstalk(self, host: str, **kwargs) -> greenstalk.Client:
        """A greenstalk client on the client host, connected to the front on `host`."""
        with self.hosts["client"].inside():
            return greenstalk.Client((self.hosts[host].address, 11300), **kwargs)

    def serve_functions(self) -> FunctionHost:
        with self.hosts["client"].inside():
            self.functions = FunctionHost(self.signing_key.encode())
        threading.Thread(target=self.functions.serve_forever, daemon=True).start()
        return self.functions

    def close(self) -> None:
        logs = self.tmp / "logs"
        logs.mkdir(exist_ok=True)
        for host in PLACEMENT:
            (logs / f"{host}.log").write_text(self.logs(host))
            subprocess.run(["podman", "rm", "-f", "-t", "0", self.container(host)],
                           capture_output=True, timeout=60)
        subprocess.run(["podman", "rmi", "-f", self.worker_image], capture_output=True, timeout=60)
        if self.functions is not None:
            self.functions.shutdown()
            self.functions.server_close()
        self.lan.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = netns_missing()
    if why:
        unavailable(why)
    require_image()
    made = Cluster(tmp_path_factory.mktemp("multihost"), zstalk_image(), podman_args())
    try:
        made.serve_functions()
        made.start("broker")
        made.wait_ready("broker")
        for host in ("front-a", "front-b", "http", "dispatcher", "worker"):
            made.start(host)
        for host in ("front-a", "front-b", "http", "dispatcher", "worker"):
            if made.workloads[PLACEMENT[host]].readiness_url("x") is not None:
                made.wait_ready(host)
        yield made
    finally:
        made.close()


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

def test_every_pod_runs_as_its_manifest_says_and_reports_ready(cluster):
    for host, workload in PLACEMENT.items():
        info = json.loads(cluster.run_podman("inspect", cluster.container(host)))[0]
        container = cluster.workloads[workload].container
        assert info["State"]["Running"], cluster.logs(host)
        assert info["Config"]["User"].split(":")[0] == "10001"
        assert info["HostConfig"]["ReadonlyRootfs"] is True
        assert info["Path"] == container["command"][0] and info["Args"] == container["args"]


def test_a_job_put_through_front_a_is_reserved_through_front_b(cluster):
    producer = cluster.beanstalk("front-a", use="crossing")
    consumer = cluster.beanstalk("front-b", watch="crossing")
    try:
        job_id = producer.put(b"from a to b")
        job = consumer.reserve(timeout=5)
        assert (job.id, job.body) == (job_id, "from a to b")
        consumer.delete(job)
    finally:
        producer.close()
        consumer.close()


def test_the_native_worker_pool_on_its_own_host_drains_its_tube(cluster):
    producer = cluster.beanstalk("front-a", use="emails")
    try:
        for n in range(40):
            producer.put(b"mail %d" % n)
        drained = lambda: producer.stats_tube("emails")
        assert wait_for(lambda: drained()["current-jobs-ready"] == 0
                        and drained()["current-jobs-reserved"] == 0, 20, step=0.2), cluster.logs("worker")
        assert drained()["cmd-delete"] == 40
    finally:
        producer.close()


def test_an_http_task_is_signed_and_dispatched_to_the_function_host(cluster):
    api = f"http://{cluster.hosts['http'].address}:8080/v1/tasks"
    auth = {"Authorization": f"Bearer {cluster.master_key}"}
    status, body = cluster.request("POST", api, {"function": "greet", "params": {"to": "k8s"}}, auth)
    assert status == 201, body
    uid = json.loads(body)["uniqueId"]

    def finished():
        status, body = cluster.get(f"{api}/{uid}", auth)
        task = json.loads(body) if status == 200 else {}
        return task.get("status") not in (None, "queued", "running") and task
    assert wait_for(finished, 20, step=0.2), cluster.logs("dispatcher")
    task = finished()
    assert task["status"] == "success" and task["result"] == {"echo": {"to": "k8s"}}, task
    assert cluster.functions.calls[-1] == {"path": "/greet", "uid": uid, "unsigned": None}


def test_an_unkeyed_enqueue_on_the_http_front_is_refused(cluster):
    api = f"http://{cluster.hosts['http'].address}:8080/v1/tasks"
    status, body = cluster.request("POST", api, {"function": "greet", "params": {}})
    assert status == 401, body


# -- outages -------------------------------------------------------------------------------

def test_cutting_front_a_returns_its_reserved_jobs_within_3_s_and_front_b_carries_on(cluster):
    held_on_a = cluster.beanstalk("front-a", use="cut", watch="cut")
    waiting_on_b = cluster.beanstalk("front-b", watch="cut")
    busy_on_b = cluster.beanstalk("front-b", use="other", watch="other")
    try:
        job_id = held_on_a.put(b"held by a")
        assert held_on_a.reserve(timeout=5).id == job_id
        cut_at = time.monotonic()
        cluster.hosts["front-a"].cut()
        for n in range(20):                      # front B serves its clients all along
            busy_on_b.put(b"%d" % n)
            busy_on_b.delete(busy_on_b.reserve(timeout=2))
        job = waiting_on_b.reserve(timeout=10)
        back_after = time.monotonic() - cut_at
        assert job.id == job_id and back_after < 3.0, back_after
        waiting_on_b.delete(job)
    finally:
        cluster.hosts["front-a"].mend()
        for client in (waiting_on_b, busy_on_b):
            client.close()
    # the broker fenced it; it starts over once its cable is back, and serves new clients
    assert wait_for(lambda: put_through(cluster, "front-a", b"served again"), 15, step=0.5), \
        cluster.logs("front-a")


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


def job_state(cluster, host: str, job_id: int) -> str | None:
    try:
        client = cluster.beanstalk(host)
    except OSError:
        return None
    try:
        return client.stats_job(job_id)["state"]
    except (OSError, greenstalk.Error):
        return None
    finally:
        client.close()


def test_a_rolling_restart_of_the_broker_keeps_connections_reservations_and_acknowledged_jobs(cluster):
    producer = cluster.beanstalk("front-b", use="durable", watch="durable")
    reader = cluster.beanstalk("front-a", use="durable", watch="durable")
    try:
        acknowledged = [producer.put(b"job %d" % n) for n in range(50)]
        held = producer.reserve(timeout=5)
        assert cluster.stop("broker") == 0, cluster.logs("broker")
        cluster.start("broker")
        cluster.wait_ready("broker")
        # front B says Hello again with its sessions; until it has, commands in flight get
        # INTERNAL_ERROR (README, "Durability"), so wait as a client would retry
        assert wait_for(lambda: job_state(cluster, "front-b", held.id) == "reserved", 15, step=0.5)
        producer.delete(held)                    # the reservation survived, on the same connection
        bodies = drain(reader, timeout=1)        # so did the other front's client
        assert sorted(bodies) == sorted(f"job {n}" for n in range(50) if acknowledged[n] != held.id)
    finally:
        producer.close()
        reader.close()


# -- strangers -----------------------------------------------------------------------------

STRANGER = r'''
import json, os, sys
import zmq
from zstalk.protocol import curve
from zstalk.protocol.schema import Hello, decode, encode

endpoint, given, mine = sys.argv[1:4]      # given: the worker's Secret; mine: for new keys

def hello(keys):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    front_id = int.from_bytes(os.urandom(8), "big") or 1
    sock.setsockopt(zmq.IDENTITY, curve.identity(front_id, keys))
    if keys is not None:
        curve.secure_client(sock, keys)
    sock.connect(endpoint)
    sock.send(encode(Hello(front_id, "client", os.getpid(), 0, [])))
    answer = type(decode(sock.recv())).__name__ if sock.poll(2000) else None
    sock.close()
    return answer

curve.keygen(mine, "stranger")
env = {curve.ENV_SERVER: given + "/broker.key"}
stranger = curve.client_keys({**env, curve.ENV_KEY: mine + "/stranger.key_secret"})
worker = curve.client_keys({**env, curve.ENV_KEY: given + "/worker.key_secret"})
print(json.dumps({"no key": hello(None), "unknown key": hello(stranger),
                  "the worker's key": hello(worker)}))
'''


def test_a_host_without_keys_cannot_say_hello_while_an_admitted_key_from_there_can(cluster, tmp_path):
    keys, mine = tmp_path / "keys", tmp_path / "mine"
    keys.mkdir()
    mine.mkdir()
    for name, value in cluster.data.secrets["zstalk-curve-worker"].items():
        (keys / name).write_bytes(value)
        (keys / name).chmod(0o600)
    result = cluster.hosts["stranger"].exec(
        [sys.executable, "-c", STRANGER, f"tcp://{cluster.hosts['broker'].address}:11500",
         str(keys), str(mine)], timeout=30)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"no key": None, "unknown key": None,
                                         "the worker's key": "Welcome"}


def test_a_front_on_a_host_without_keys_gets_no_stats_and_no_jobs(cluster):
    """The beanstalk front's manifest command on the stranger host, with no Secret: it
    will not start without keys, and made to go without (ZSTALK_INSECURE=1) its clients get
    neither stats nor jobs, and its readiness says why."""
    args = cluster.workloads["zstalk-front-beanstalk"].container["args"]
    name = f"{cluster.lan.prefix}-stranger"
    base = ["run", "--name", name, "--network", f"ns:{cluster.hosts['stranger'].path}",
            "--add-host", f"zstalk-broker:{cluster.hosts['broker'].address}", *cluster.run_args]
    refused = subprocess.run(["podman", *base, "--rm", cluster.image, *args], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode != 0
    assert "tcp://zstalk-broker:11500 is beyond this host and no CURVE keys are set" in refused.stderr
    cluster.run_podman(*base, "-d", "-e", "ZSTALK_INSECURE=1", cluster.image, *args)
    readyz = f"http://{cluster.hosts['stranger'].address}:8081/readyz"
    try:
        assert wait_for(lambda: cluster.get(readyz)[0] != 0, READY_S, step=0.2)
        with cluster.hosts["client"].inside():
            client = greenstalk.Client((cluster.hosts["stranger"].address, 11300))
        client._sock.settimeout(20)
        try:
            with pytest.raises(greenstalk.InternalError):
                client.stats()                      # held for --hold-s, then refused
            with pytest.raises(greenstalk.InternalError):
                client.reserve(timeout=0)
        finally:
            client.close()
        status, body = cluster.get(readyz)
        assert (status, body.startswith(b"no broker for")) == (503, True), body
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, timeout=60)
