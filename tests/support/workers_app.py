"""Example workers that tests/end_to_end/test_workers_end_to_end.py runs as real processes with
`python -m zstalk.broker.run worker tests.support.workers_app:NAME --broker EP`.

Bodies are JSON orders ({"sleep": s, "fail": true, "retry": delay_s}) so one handler
serves every test.  Each handler appends "event id attempt pid monotonic" lines to the file named by
$ZSTALK_TEST_LOG (one small O_APPEND write per line: processes never interleave), which
is how a test sees what a pool process did and when (CLOCK_MONOTONIC is system-wide).
"""
from __future__ import annotations

import os
import time

from zstalk.workers import Backoff, Job, Retry, Worker, codecs


def record(event: str, job: Job) -> None:
    line = f"{event} {job.id} {job.attempt} {os.getpid()} {time.monotonic():.6f}\n"
    fd = os.open(os.environ["ZSTALK_TEST_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def obey(job: Job) -> None:
    """Do what the body says, recording the start and the end."""
    order = job.body
    record("start", job)
    time.sleep(order.get("sleep", 0))
    if order.get("fail"):
        raise RuntimeError("failing on purpose")
    if "retry" in order:
        raise Retry(delay_s=order["retry"])
    record("end", job)


#: one handler at a time, one job prefetched beyond it, a short grace
slow = Worker(concurrency=1, prefetch=2, codec=codecs.json, grace_s=3.0,
              backoff=Backoff(base_s=0))
slow.handler("slow")(obey)

#: for --processes 2
shared = Worker(concurrency=1, prefetch=0, codec=codecs.json)
shared.handler("shared")(obey)

#: for tests/workers/test_pool_metrics.py: a failing job is buried at once (its first attempt is
#: its last), so every outcome is final
metered = Worker(concurrency=1, prefetch=0, codec=codecs.json, max_attempts=1)
metered.handler("metered")(obey)
