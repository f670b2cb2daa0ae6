# Probes of one connection sending one command at a time, the way greenstalk / pystalk
# clients work: a blocking socket (TCP_NODELAY; reads that wait 15 s in the kernel fail,
# minimal.blocking_socket, rather than a Python socket timeout, which would poll() before
# every read) sends one command with one sendall() and reads until the whole reply is in
# before sending the next.  (One command at a time *rates* are the minimal client's,
# minimal.py, in a process of its own.)
#
# * request_latency: n puts, each request timed with time.perf_counter() from just before
#   sendall() to the reply's \r\n; p50 / p99 in ms.
# * bg_put_main: a forked process keeping a pipelined put load on a server (loadgen's
#   put_loop in rounds, each round ending with all its replies in, until told to stop
#   between rounds), for latency "under load" (latency_under_load).
# * exec_to_first_reply: a server's start as a client sees it, from just before Popen to
#   the first INSERTED, connect() retried every 0.5 ms; beside it exec_to_exit, the same
#   clock on a command that exits by itself (a floor: the interpreter's own start).
from __future__ import annotations

import multiprocessing
import socket
import threading
import time

from .loadgen import PUT_CMD, RECV_SIZE, connect_many, put_loop, set_lowat
from .minimal import blocking_socket
from .procs import children
from .stats import pct


def request_latency(addr, n: int, time_cap: float) -> dict:
    """One blocking connection, n puts one at a time; each request's round
    trip (sendall of the put to its whole INSERTED line) timed with perf_counter()."""
    sock = blocking_socket(addr)
    send, recv, clock = sock.sendall, sock.recv, time.perf_counter
    lat, bad, errors, capped = [], [], [], False
    deadline = time.monotonic() + time_cap
    try:
        for i in range(n):
            if i & 63 == 63 and time.monotonic() >= deadline:
                capped = True
                break
            t = clock()
            send(PUT_CMD)
            r = recv(RECV_SIZE)
            while not r.endswith(b"\r\n"):
                d = recv(RECV_SIZE)
                if not d:
                    raise EOFError(f"server closed the connection after {len(lat)} puts")
                r += d
            dt = clock() - t
            if r.startswith(b"INSERTED ") and r.find(b"\n") == len(r) - 1:
                lat.append(dt * 1000.0)
            else:
                bad.append(r[:80])
    except (OSError, EOFError) as exc:
        errors.append(f"after {len(lat)} puts: {exc!r}")
    sock.close()
    if bad:
        errors.append(f"{len(bad)} unexpected replies, e.g. {bad[:3]!r}")
    return dict(count=len(lat), p50=pct(lat, 50) if lat else None,
                p99=pct(lat, 99) if lat else None, max=max(lat) if lat else None,
                mean=sum(lat) / len(lat) if lat else None, capped=capped, errors=errors,
                lat_ms=[round(x, 4) for x in lat])


def bg_put_main(pipe, go, stop, addr, n_conns: int, window: int, time_cap: float,
                chunk: int = 2000):
    """A background load (a forked process): pipelined puts on n_conns connections,
    `window` in flight each, until `stop` is set (or time_cap).  put_loop runs in rounds
    of `chunk` puts per connection, each round ending with all its replies in; `stop` is
    looked at between rounds."""
    try:
        socks = connect_many(addr, n_conns)
    except BaseException as exc:
        pipe.send(dict(count=0, errors=[f"load process: {exc!r}"]))
        pipe.close()
        return
    pipe.send("ready")
    count = replies = rounds = 0
    cpu, errors, hit_cap = 0.0, [], False
    go.wait(60)
    cpu0, t0 = time.process_time(), time.monotonic()
    deadline = t0 + time_cap
    try:
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                hit_cap = True
                break
            r = put_loop(socks, [chunk] * n_conns, window, left)
            count += r["count"]
            replies += r["replies"]
            rounds += 1
            errors += r["errors"]
            if r["capped"] or r["errors"]:
                hit_cap = hit_cap or r["capped"]
                break
            for s in socks:                   # put_loop starts from a low-water mark of 1
                set_lowat(s, 1)
    except BaseException as exc:
        errors.append(f"load process: {exc!r}")
    t1, cpu1 = time.monotonic(), time.process_time()
    for s in socks:
        s.close()
    wall = t1 - t0
    pipe.send(dict(count=count, replies=replies, rounds=rounds, wall=wall,
                   rate=count / wall if wall > 0 else 0.0,
                   gen_cpu_share=(cpu1 - cpu0) / wall if wall > 0 else 0.0,
                   hit_time_cap=hit_cap, errors=errors))
    pipe.close()


def exec_to_exit(srv, cap: float = 10.0) -> dict:
    """A floor for exec_to_first_reply: ms from just before Popen of `srv`'s command to
    its exit."""
    t0 = srv.spawn()
    # (a blocking wait: Popen.wait(timeout) polls with sleeps that grow to 50 ms)
    timer = threading.Timer(cap, srv.proc.p.kill)
    timer.start()
    rc = srv.proc.p.wait()
    ms = (time.monotonic() - t0) * 1000
    timer.cancel()
    return dict(listen_ms=None, first_ms=ms if rc == 0 else None, refused=0, dropped=0,
                errors=[] if rc == 0 else [f"exit status {rc}: {srv.proc.output()[:200]!r}"])


def exec_to_first_reply(srv, cap: float = 10.0) -> dict:
    """Start `srv`'s command, retry connect() every 0.5 ms, then one put; ms from
    just before Popen to the first accepted connection and to the INSERTED reply."""
    if srv.kind == "floor":
        return exec_to_exit(srv, cap)
    t0 = srv.spawn()
    deadline = t0 + cap
    listen = first = None
    errors, refused, dropped = [], 0, 0
    while first is None and not errors:
        if time.monotonic() >= deadline:
            errors.append(f"no INSERTED within {cap:.0f} s ({refused} connects refused, "
                          f"{dropped} connections dropped)")
            break
        s = socket.socket()
        try:
            s.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                s.connect(srv.addr)
            except ConnectionRefusedError:
                refused += 1
                if not srv.alive():
                    errors.append(f"{srv.name} exited with {srv.proc.p.returncode}")
                time.sleep(0.0005)
                continue
            if listen is None:
                listen = time.monotonic()
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(b"put 0 0 60 1\r\nx\r\n")
            r = b""
            while not r.endswith(b"\r\n"):
                d = s.recv(100)
                if not d:
                    raise ConnectionResetError("closed before replying")
                r += d
            if r.startswith(b"INSERTED "):
                first = time.monotonic()
            else:
                errors.append(f"first reply {r[:80]!r}")
        except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError):
            dropped += 1                          # accepted, then dropped: try again
            time.sleep(0.0005)
        except OSError as exc:
            errors.append(repr(exc))
        finally:
            s.close()
    if srv.alive():
        srv.start_children = sorted(children(srv.proc.pid))
    ms = lambda t: (t - t0) * 1000 if t is not None else None      # noqa: E731
    return dict(listen_ms=ms(listen), first_ms=ms(first), refused=refused, dropped=dropped,
                errors=errors)


def latency_under_load(srv, n, cap):
    """request_latency() while another process keeps 8 connections x 32 puts in flight."""
    ctx = multiprocessing.get_context("fork")
    go, stop = ctx.Event(), ctx.Event()
    mine, theirs = ctx.Pipe()
    p = ctx.Process(target=bg_put_main, args=(theirs, go, stop, srv.addr, 8, 32, cap + 30.0))
    p.start()
    try:
        if not mine.poll(30):
            raise RuntimeError("load process did not get ready")
        msg = mine.recv()
        if msg != "ready":
            raise RuntimeError(f"load process: {msg.get('errors')}")
        c0, w0 = srv.cpu_s(), time.monotonic()
        go.set()
        time.sleep(0.2)                  # the load up to speed before the first probe
        res = request_latency(srv.addr, n, cap)
        stop.set()
        if not mine.poll(60):
            raise RuntimeError("load process did not report")
        load = mine.recv()
        res["server_cpu_share"] = (srv.cpu_s() - c0) / (time.monotonic() - w0)
    finally:
        stop.set()
        go.set()
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join(5)
    res["load"] = load
    res["errors"] += [f"load: {e}" for e in load["errors"][:3]]
    if load.get("hit_time_cap"):
        res["errors"].append("load: ran into its time cap before the probe ended")
    return res
