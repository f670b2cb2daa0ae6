"""The production overlay, run as Kubernetes would run it, on hosts joined by a network.

Every zstalk process here is the zstalk image (scripts/build-image) in a podman container,
started with exactly the command, arguments, environment, mounts and security context that
`kubectl kustomize k8s/overlays/production` gives its pod (tests/support/pods.py), each pod on a
host of its own: a network namespace plugged into one bridge (tests/support/netns.py), as pods get
their own IPs.  Service names resolve to those hosts.  The Secrets are made as the k8s
README says (`zstalk keygen` for every role), so CURVE is on for every link to the broker.

  broker     the StatefulSet: `zstalk broker --binlog /data -f 0 ...`, /data kept on the host
  front-a    zstalk-front-beanstalk       front-b   zstalk-front-beanstalk (a second pod)
  http       zstalk-front-http            dispatcher  zstalk-dispatcher
  worker     zstalk-worker, in an image built FROM zstalk's with docs/kubernetes.md's
             Dockerfile.worker and this test's app/jobs.py (buildah)
  client     producers and consumers (greenstalk, HTTP), and the function host the rendered
             zstalk.toml names (http://functions:3000)
  stranger   a host without any key

The module's tests share one cluster and run in order: the outage and restart tests leave it
whole again for the ones after.  Needs root, iproute2 and podman: without them it skips,
except under CI=true, where it fails.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import greenstalk
import pytest

from image import podman_args, require_image, zstalk_image
from multihost import (CLIENT_TIMEOUT_S, PLACEMENT, READY_S, Cluster, drain, put_through)
from netns import Lan, netns_missing
from servers import unavailable, wait_for


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = netns_missing()
    if why:
        unavailable(why)
    require_image()
    image = zstalk_image()
    with Lan() as lan:
        made = Cluster(tmp_path_factory.mktemp("multihost"), image, podman_args(), lan)
        try:
            made.serve_functions()
            made.start("broker")
            made.wait_ready("broker")
            for host in ("front-a", "front-b", "http", "dispatcher", "worker"):
                made.start(host)
            for host in ("front-a", "front-b", "http", "dispatcher", "worker"):
                made.wait_ready(host)
            yield made
        finally:
            made.close()


def test_every_pod_runs_as_its_manifest_says_and_reports_ready(cluster):
    for host, workload in PLACEMENT.items():
        info = json.loads(cluster.run_podman("inspect", cluster.container(host)))[0]
        container = cluster.workloads[workload].container
        assert info["State"]["Running"], cluster.logs(host)
        assert info["Config"]["User"].split(":")[0] == "10001"
        assert info["HostConfig"]["ReadonlyRootfs"] is True
        assert info["Path"] == container["command"][0] and info["Args"] == container["args"]
        url = cluster.workloads[workload].readiness_url(cluster.hosts[host].address)
        assert cluster.get(url)[0] == 200, url


def test_every_pod_serves_its_metrics_only_to_the_token_its_secret_holds(cluster):
    roles = {"zstalk-broker": "broker", "zstalk-front-beanstalk": "front",
             "zstalk-front-http": "front", "zstalk-dispatcher": "dispatcher",
             "zstalk-worker": "pool"}
    for host, workload in PLACEMENT.items():
        probe = cluster.workloads[workload].readiness_url(cluster.hosts[host].address)
        url = probe.rsplit("/", 1)[0] + "/metrics"
        assert cluster.get(url)[0] == 401, url
        status, body = cluster.get(url, {"Authorization": f"Bearer {cluster.metrics_token}"})
        assert status == 200 and f'role="{roles[workload]}"'.encode() in body, (url, body[:300])


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
    got: list = []
    try:
        job_id = held_on_a.put(b"held by a")
        assert held_on_a.reserve(timeout=5).id == job_id
        waiter = threading.Thread(target=lambda: got.append(
            (waiting_on_b.reserve(timeout=10), time.monotonic())))
        waiter.start()                           # front B's client waits for it already
        cut_at = time.monotonic()
        cluster.hosts["front-a"].cut()
        for n in range(20):                      # front B serves its clients all along
            busy_on_b.put(b"%d" % n)
            busy_on_b.delete(busy_on_b.reserve(timeout=2))
        waiter.join(15)
        (job, at), = got
        assert job.id == job_id and at - cut_at < 3.0, at - cut_at
        waiting_on_b.delete(job)
    finally:
        cluster.hosts["front-a"].mend()
        for client in (held_on_a, waiting_on_b, busy_on_b):
            client.close()
    # the broker fenced it; it starts over once its cable is back, and serves new clients
    assert wait_for(lambda: put_through(cluster, "front-a", b"served again"), 15, step=0.5), \
        cluster.logs("front-a")


def test_a_rolling_restart_of_the_broker_keeps_connections_reservations_and_acknowledged_jobs(cluster):
    """As a StatefulSet update does it: SIGTERM (podman stop), then a new broker on the
    same volume.  The fronts hold what their clients send meanwhile (Stopping), so no
    command fails, not even a reserve or an HTTP enqueue sent while no broker runs."""
    producer = cluster.beanstalk("front-b", use="durable", watch="durable")
    reader = cluster.beanstalk("front-a", use="durable", watch="durable")
    fronts = ("front-a", "front-b", "http")
    said_before = {front: len(cluster.logs(front)) for front in fronts}    # (earlier tests')
    try:
        acknowledged = [producer.put(b"job %d" % n) for n in range(50)]
        held = producer.reserve(timeout=5)
        assert cluster.stop("broker") == 0, cluster.logs("broker")
        first, enqueued = [], []                 # sent while no broker runs:
        waiting = threading.Thread(target=lambda: first.append(reader.reserve(timeout=20)))
        posting = threading.Thread(target=lambda: enqueued.append(cluster.request(
            "POST", f"http://{cluster.hosts['http'].address}:8080/v1/tasks",
            {"function": "greet", "params": {"during": "restart"}},
            {"Authorization": f"Bearer {cluster.master_key}"}, timeout=CLIENT_TIMEOUT_S)))
        waiting.start()
        posting.start()
        cluster.start("broker")
        producer.delete(held)                    # the reservation survived, on the same connection
        waiting.join(CLIENT_TIMEOUT_S)
        posting.join(CLIENT_TIMEOUT_S)
        assert enqueued[0][0] == 201, enqueued
        reader.delete(first[0])
        bodies = [first[0].body, *drain(reader, timeout=1)]
        assert sorted(bodies) == sorted(f"job {n}" for n in range(50) if acknowledged[n] != held.id)
        for front in fronts:
            # told by Stopping, each held and went to the next broker as a normal stop
            # (INFO, not shown without -V): any other loss of the broker is a WARNING
            said = cluster.logs(front)[said_before[front]:]
            assert "lost the broker" not in said, said
    finally:
        producer.close()
        reader.close()


# -- strangers -----------------------------------------------------------------------------

STRANGER = r'''
import json, os, sys
import zmq
from zstalk.protocol.network import curve
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
         str(keys), str(mine)], timeout=90)      # (three hellos of 2 s at most; a guard)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"no key": None, "unknown key": None,
                                         "the worker's key": "Welcome"}


def test_a_front_on_a_host_without_keys_gets_no_stats_and_no_jobs(cluster):
    """The beanstalk front's manifest command on the stranger host, with no Secret: it
    will not start without keys, and made to go without (ZSTALK_INSECURE=1) its clients get
    neither stats nor jobs, and its readiness says why."""
    with cluster.hosts["stranger"].inside():      # the broker's port is reachable from there
        socket.create_connection((cluster.hosts["broker"].address, 11500), timeout=5).close()
    args = cluster.workloads["zstalk-front-beanstalk"].container["args"]
    name = f"{cluster.lan.prefix}-stranger"
    base = ["run", "--name", name, "--network", f"ns:{cluster.hosts['stranger'].path}",
            "--add-host", f"zstalk-broker:{cluster.hosts['broker'].address}", *cluster.run_args]
    refused = subprocess.run(["podman", *base, "--rm", cluster.image, *args], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode != 0
    assert "tcp://zstalk-broker:11500 is beyond this host and no CURVE keys are set" in refused.stderr
    # (a hold of 2 s instead of the manifest's 30: what is held is refused sooner)
    cluster.run_podman(*base, "-d", "-e", "ZSTALK_INSECURE=1", cluster.image, *args,
                       "--hold-s", "2")
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
        assert cluster.get(readyz) == (503, b"no broker yet\n")
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, timeout=60)
