"""CurveZMQ between actors: keys made by `zstalk keygen`, a broker that admits only listed
public keys, identities bound to keys, key rotation on SIGHUP, and the safe defaults for
endpoints beyond this host.  Real processes on loopback; a raw ZeroMQ peer plays the
intruder."""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import zmq

from servers import (LOOPBACK, RawClient, ServerProcess, find_zstalk, free_port, self_check,
                     wait_for)
from zstalk.protocol.network import curve
from zstalk.protocol.links import handshakes
from zstalk.protocol.schema import Hello, Welcome, decode, encode
from zstalk.workers import Client

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")
WAIT_S = 10.0
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def keys(tmp_path):
    """Key pairs for the broker and three clients; `admitted` lists a and b."""
    made = {name: curve.keygen(str(tmp_path / "keys"), name)
            for name in ("broker", "a", "b", "stranger")}
    admitted = tmp_path / "admitted"
    admitted.mkdir()
    for name in ("a", "b"):
        shutil.copy(made[name][0], admitted)
    return tmp_path, made, admitted


def server_env(keys) -> dict:
    _, made, admitted = keys
    return {**os.environ, curve.ENV_KEY: made["broker"][1], curve.ENV_CLIENTS: str(admitted)}


def client_env(keys, name: str) -> dict:
    _, made, _ = keys
    return {**os.environ, curve.ENV_KEY: made[name][1], curve.ENV_SERVER: made["broker"][0]}


def client_keys(keys, name: str) -> curve.ClientKeys:
    return curve.client_keys(client_env(keys, name))


@pytest.fixture
def broker(keys):
    port = free_port()
    proc = ServerProcess([find_zstalk(), "-V", "broker", "--bind", f"tcp://{LOOPBACK}:{port}"],
                         (LOOPBACK, port), env=server_env(keys), name="curve-broker").start()
    proc.endpoint = f"tcp://{LOOPBACK}:{port}"
    yield proc
    proc.stop()


def hello(endpoint: str, keys: curve.ClientKeys | None, ident: bytes | None = None,
          wait_s: float = 1.5):
    """Say Hello as a raw front: the broker's answer, or None if none came."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    front_id = int.from_bytes(os.urandom(8), "big") or 1
    sock.setsockopt(zmq.IDENTITY, ident or curve.identity(front_id, keys))
    if keys is not None:
        curve.secure_client(sock, keys)
    # a refused handshake drops the connection's queue, and a send that finds none waits
    # for the next: at most wait_s (it hung the whole suite once)
    sock.setsockopt(zmq.SNDTIMEO, int(wait_s * 1000))
    sock.connect(endpoint)
    try:
        try:
            sock.send(encode(Hello(front_id, "client", os.getpid(), 0, [])))
        except zmq.Again:
            return None
        if sock.poll(int(wait_s * 1000)):
            return decode(sock.recv())
        return None
    finally:
        sock.close()


# -- keys ------------------------------------------------------------------------------------
def test_keygen_writes_a_public_key_and_a_secret_only_its_owner_can_read(tmp_path):
    public, secret = curve.keygen(str(tmp_path / "k"), "front")
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(public).st_mode) == 0o644
    with pytest.raises(curve.CurveError, match="never overwritten"):
        curve.keygen(str(tmp_path / "k"), "front")


def test_the_keygen_command_says_where_each_key_goes(tmp_path):
    out = subprocess.run([find_zstalk(), "keygen", str(tmp_path), "w1"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and "ZSTALK_CURVE_CLIENTS" in out.stdout
    assert (tmp_path / "w1.key").exists() and (tmp_path / "w1.key_secret").exists()


# -- the broker admits listed keys only -------------------------------------------------------
def test_a_client_with_an_admitted_key_is_welcomed(broker, keys):
    assert isinstance(hello(broker.endpoint, client_keys(keys, "a")), Welcome)


@pytest.mark.parametrize("who", ["no keys", "unknown key"])
def test_a_peer_without_an_admitted_key_gets_nothing_and_others_are_served(broker, keys, who):
    intruder = None if who == "no keys" else client_keys(keys, "stranger")
    assert hello(broker.endpoint, intruder) is None
    assert isinstance(hello(broker.endpoint, client_keys(keys, "b")), Welcome)
    assert broker.running
    if intruder is not None:            # the refusal names the address and the key
        line = [ln for ln in broker.output().splitlines() if "is not admitted" in ln]
        assert (f"refused a peer from {LOOPBACK}: its CURVE key "
                f"{curve.fingerprint(intruder.public).hex()} is not admitted") in line[0]


def test_a_valid_key_cannot_speak_as_another_keys_identity(broker, keys):
    a, b = client_keys(keys, "a"), client_keys(keys, "b")
    stolen = (42).to_bytes(8, "big") + curve.fingerprint(a.public)
    assert hello(broker.endpoint, b, ident=stolen) is None      # b's key, a's identity
    assert isinstance(hello(broker.endpoint, a, ident=stolen), Welcome)
    deadline = time.monotonic() + WAIT_S
    while "its identity is not its key's" not in broker.output():
        assert time.monotonic() < deadline, broker.output()
        time.sleep(0.05)


def test_a_key_removed_from_the_directory_is_refused_after_sighup(broker, keys):
    _, _, admitted = keys
    assert isinstance(hello(broker.endpoint, client_keys(keys, "a")), Welcome)
    os.unlink(admitted / "a.key")
    broker.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + WAIT_S
    while "1 client keys admitted" not in broker.output():
        assert time.monotonic() < deadline, broker.output()
        time.sleep(0.05)
    assert hello(broker.endpoint, client_keys(keys, "a")) is None
    assert isinstance(hello(broker.endpoint, client_keys(keys, "b")), Welcome)


def test_a_front_and_a_producer_with_keys_work_end_to_end(broker, keys):
    port = free_port()
    front = ServerProcess([find_zstalk(), "front", "beanstalk", "--broker", broker.endpoint,
                           "--listen", f"{LOOPBACK}:{port}"], (LOOPBACK, port),
                          env=client_env(keys, "a"), probe=b"list-tubes\r\n",
                          name="curve-front").start()
    try:
        producer = Client(broker.endpoint, keys=client_keys(keys, "b"))
        job_id = producer.put(b"sealed")
        producer.close()
        with RawClient((LOOPBACK, port)) as client:
            client.send(b"reserve-with-timeout 5\r\n")
            assert client.read_reply() == f"RESERVED {job_id} 6\r\nsealed\r\n".encode()
    finally:
        front.stop()


def test_a_producer_without_keys_is_not_welcomed(broker):
    producer = Client(broker.endpoint, keys=None, timeout_s=1.0)
    with pytest.raises(Exception):
        producer.put(b"x")
    producer.close()


# -- safe defaults ---------------------------------------------------------------------------
def test_a_broker_beyond_loopback_without_keys_refuses_to_start_and_says_why(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZSTALK_")}
    out = subprocess.run([find_zstalk(), "broker", "--bind", f"tcp://0.0.0.0:{free_port()}"],
                         capture_output=True, text=True, timeout=30, env=env)
    assert out.returncode == 2
    assert "beyond this host" in out.stderr and "ZSTALK_CURVE_KEY" in out.stderr
    assert "--insecure" in out.stderr


def test_insecure_lets_it_start_and_warns(tmp_path):
    port = free_port()
    proc = ServerProcess([find_zstalk(), "broker", "--insecure", "--bind", f"tcp://0.0.0.0:{port}"],
                         (LOOPBACK, port), name="insecure-broker").start()
    try:
        deadline = time.monotonic() + WAIT_S
        while "without CURVE keys" not in proc.output():
            assert time.monotonic() < deadline, proc.output()
            time.sleep(0.05)
    finally:
        proc.stop()


def test_a_front_refuses_a_broker_beyond_this_host_without_keys():
    """(It never connects: the refusal comes first.)"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZSTALK_")}
    out = subprocess.run([find_zstalk(), "front", "beanstalk", "--broker", "tcp://192.0.2.1:1",
                          "--listen", f"{LOOPBACK}:{free_port()}"], capture_output=True,
                         text=True, timeout=30, env=env)
    assert out.returncode == 2 and "ZSTALK_CURVE_SERVER" in out.stderr


@pytest.mark.parametrize("endpoint, local", [
    ("ipc:///tmp/x", True), ("inproc://x", True), ("tcp://127.0.0.1:1", True),
    ("tcp://127.9.9.9:1", True), ("tcp://localhost:1", True), ("tcp://[::1]:1", True),
    ("tcp://0.0.0.0:1", False), ("tcp://*:1", False), ("tcp://10.0.0.1:1", False),
    ("tcp://broker.example:1", False), ("tcp://eth0:1", False),
])
def test_only_loopback_and_local_transports_count_as_this_host(endpoint, local):
    assert curve.is_local(endpoint) is local


def test_a_worker_refuses_a_broker_beyond_this_host_without_keys(tmp_path):
    (tmp_path / "idle.py").write_text("from zstalk.workers import Worker\nworker = Worker()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZSTALK_")}
    out = subprocess.run([find_zstalk(), "worker", "idle:worker", "--processes", "2",
                          "--broker", "tcp://192.0.2.1:1"], capture_output=True, text=True,
                         timeout=30, env=env, cwd=tmp_path)
    assert out.returncode == 2 and "worker: tcp://192.0.2.1:1 is beyond this host" in out.stderr


def test_a_host_outside_the_accepted_networks_is_closed_before_any_handshake(keys):
    port = free_port()
    env = {**server_env(keys), curve.ENV_ACCEPT: f"{LOOPBACK}/32"}
    proc = ServerProcess([find_zstalk(), "broker", "--bind", f"tcp://{LOOPBACK}:{port}"],
                         (LOOPBACK, port), env=env, name="filtered-broker").start()
    try:
        endpoint = f"tcp://{LOOPBACK}:{port}"
        outside = f"tcp://127.0.0.3:0;{LOOPBACK}:{port}"        # from 127.0.0.3
        assert hello(outside, client_keys(keys, "a")) is None       # even with a good key
        assert hello(outside, client_keys(keys, "stranger")) is None
        assert isinstance(hello(endpoint, client_keys(keys, "a")), Welcome)
        assert "refused a CURVE handshake" not in proc.output()     # never got that far
    finally:
        proc.stop()


def test_a_bad_accepted_network_is_refused_by_name():
    with pytest.raises(curve.CurveError, match="'10.0.0.300' is not an IP address"):
        curve.accepted_networks({curve.ENV_ACCEPT: "127.0.0.1, 10.0.0.300"})
    assert curve.accepted_networks({curve.ENV_ACCEPT: "127.0.0.1,10.1.2.3/8"}) == (
        "127.0.0.1/32", "10.0.0.0/8")


def test_a_native_worker_pool_with_keys_drains_its_tube(broker, keys):
    from zstalk.workers import Worker
    producer = Client(broker.endpoint, keys=client_keys(keys, "b"))
    for n in range(20):
        producer.put(b"%d" % n, tube="sealed")
    producer.close()
    seen = []
    worker = Worker(keys=client_keys(keys, "a"))
    worker.handler("sealed")(lambda job: seen.append(job.body))
    counts = worker.run_until_idle(broker.endpoint, timeout_s=20)
    assert counts.get("deleted") == 20 and sorted(seen) == sorted(b"%d" % n for n in range(20))


def test_every_process_of_a_worker_pool_takes_its_keys_from_the_environment(broker, keys, tmp_path):
    """`zstalk worker --processes 2` spawns its pools: each must read ZSTALK_CURVE_* as the
    parent does (they once went without keys and were never welcomed)."""
    producer = Client(broker.endpoint, keys=client_keys(keys, "b"))
    log = tmp_path / "log"
    pool = subprocess.Popen([find_zstalk(), "worker", "tests.support.workers_app:shared", "--processes", "2",
                             "--broker", broker.endpoint],
                            cwd=ROOT, env={**client_env(keys, "a"), "ZSTALK_TEST_LOG": str(log)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for n in range(10):
            producer.put(b"{}", tube="shared")
        assert wait_for(lambda: log.exists() and log.read_text().count("end ") == 10, 3 * WAIT_S)
    finally:
        producer.close()
        pool.terminate()
        pool.wait(10)


# -- saying why a peer is not welcomed ----------------------------------------------------
def front_saying(broker, env: dict, expected: str, keep_until=None) -> str:
    """Run a beanstalk front with `env` against the broker until its log holds `expected`
    (the waiting line comes after PEER_TIMEOUT_S without a Welcome), and then, with
    `keep_until`, until that holds too (the front goes on retrying meanwhile)."""
    port = free_port()
    proc = subprocess.Popen([find_zstalk(), "front", "beanstalk", "--broker", broker.endpoint,
                             "--listen", f"{LOOPBACK}:{port}"], env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines = []
    try:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            lines.append(line)
            if expected in line or not line:
                break
        if keep_until is not None:
            wait_for(keep_until, 3 * WAIT_S)
    finally:
        proc.terminate()
        proc.wait(10)
    return "".join(lines)


def keyless_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("ZSTALK_CURVE")}


def test_a_front_without_keys_says_the_broker_uses_curve_and_which_variables_to_set(broker):
    said = front_saying(broker, keyless_env(), "has not welcomed")
    assert f"the broker at {broker.endpoint} has not welcomed this process for " in said
    assert (" s: the broker uses CURVE and this process has no keys: set ZSTALK_CURVE_KEY "
            "(this process's .key_secret) and ZSTALK_CURVE_SERVER") in said


def test_a_front_whose_key_is_not_admitted_is_told_to_put_it_in_the_clients_directory(
        broker, keys):
    said = front_saying(broker, client_env(keys, "stranger"), "has not welcomed")
    assert "the broker does not admit this process's public key: copy its .key into the " \
           "broker's ZSTALK_CURVE_CLIENTS directory" in said


def test_a_front_with_the_wrong_broker_key_is_told_so(broker, keys):
    _, made, _ = keys
    env = {**client_env(keys, "a"), curve.ENV_SERVER: made["b"][0]}     # b's key, not the broker's
    said = front_saying(broker, env, "has not welcomed")
    assert "ZSTALK_CURVE_SERVER is likely not the broker's public key" in said


def test_the_broker_logs_a_refused_keyless_peer_once_per_host_for_many_attempts(broker):
    # The broker sees the mismatch only when it reads the front's greeting before the front,
    # which sees it too, closes: on a loaded machine many attempts lose that race, so the
    # front goes on retrying until the broker has said it (or 30 s).
    said_it = lambda: "it has no CURVE keys" in broker.output()     # noqa: E731
    said = front_saying(broker, keyless_env(), "has not welcomed", keep_until=said_it)
    assert "has not welcomed" in said                                # ~20 attempts by then
    assert said_it(), broker.output()
    hosts = [ln.split("refused a peer from ")[1].split(":")[0] for ln in
             broker.output().splitlines() if "it has no CURVE keys" in ln]
    assert sorted(set(hosts)) == sorted(hosts), hosts        # each host once


def test_a_refusal_log_says_each_host_and_reason_once_a_minute_with_the_count_since(caplog):
    now = [0.0]
    said = curve.RefusalLog(clock=lambda: now[0])
    for t in (0.0, 1.0, 2.0, 59.0, 61.0):
        now[0] = t
        said.refused("10.0.0.5", "its key is not admitted", "auth")
    said.refused("10.0.0.5", "it has no CURVE keys", "keyless")
    said.refused("10.0.0.6", "its key is not admitted", "auth")
    assert [r.getMessage() for r in caplog.records] == [
        "refused a peer from 10.0.0.5: its key is not admitted",
        "refused a peer from 10.0.0.5: its key is not admitted (3 more refused since the last "
        "such line)",
        "refused a peer from 10.0.0.5: it has no CURVE keys",
        "refused a peer from 10.0.0.6: its key is not admitted"]


# -- asking an endpoint what answers there (handshakes.probe) ---------------------------------
def probe(endpoint: str) -> str | None:
    return asyncio.run(handshakes.probe(endpoint))


@pytest.mark.parametrize("uses_curve", [True, False])
def test_a_probe_reads_the_mechanism_a_zeromq_peer_greets_with(uses_curve):
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    if uses_curve:
        sock.curve_server = True
        sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
    try:
        port = sock.bind_to_random_port(f"tcp://{LOOPBACK}")
        assert probe(f"tcp://{LOOPBACK}:{port}") == ("CURVE" if uses_curve else "NULL")
    finally:
        sock.close()


def test_a_probe_of_a_port_where_nothing_listens_finds_it_refused(tmp_path):
    assert probe(f"tcp://{LOOPBACK}:{free_port()}") == handshakes.REFUSED
    assert probe(f"ipc://{tmp_path}/nobody") == handshakes.REFUSED


def _one_shot_server(answer: bytes | None) -> tuple[int, threading.Thread]:
    """A TCP server that takes one connection and closes it at once (answer None) or after
    writing `answer`."""
    listener = socket.create_server((LOOPBACK, 0))
    port = listener.getsockname()[1]

    def serve():
        with listener:
            conn, _ = listener.accept()
            with conn:
                if answer is not None:
                    conn.recv(64)
                    conn.sendall(answer)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return port, thread


def test_a_probe_tells_a_peer_that_closes_at_once_from_one_that_is_not_zeromq():
    port, thread = _one_shot_server(None)
    assert probe(f"tcp://{LOOPBACK}:{port}") == handshakes.CLOSED
    thread.join(5)
    port, thread = _one_shot_server(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    assert probe(f"tcp://{LOOPBACK}:{port}") == handshakes.NOT_ZMTP
    thread.join(5)


def test_what_a_probe_finds_settles_the_cause_before_the_monitors_guess():
    assert "the broker uses CURVE and this process has no keys" in handshakes.probed_cause(
        "CURVE", has_keys=False, guess="a guess")
    assert "this process has CURVE keys" in handshakes.probed_cause("NULL", has_keys=True)
    assert "nothing listens there" in handshakes.probed_cause(handshakes.REFUSED, False)
    assert handshakes.probed_cause("CURVE", has_keys=True, guess="a guess") == "a guess"
    assert "does not admit this process's key" in handshakes.probed_cause("CURVE", True)
    assert handshakes.probed_cause(None, False) is None


def test_a_front_pointed_where_nothing_listens_says_so():
    said = front_saying(SimpleNamespace(endpoint=f"tcp://{LOOPBACK}:{free_port()}"),
                        keyless_env(), "has not welcomed")
    assert "nothing listens there (connection refused)" in said
