"""Workers that tests/end_to_end/test_pools_end_to_end.py runs as real processes:
`zstalk worker tests.support.pools_app:NAME --broker EP`.  Each handler appends one line per job
it starts to the file named by $POOLS_APP_OUT ("id tube attempt body-hex"), which is how
the tests see what a pool did without asking the pool."""
from __future__ import annotations

import os
import time

from zstalk.workers import Bury, Job, Worker


def record(job: Job) -> None:
    with open(os.environ["POOLS_APP_OUT"], "a") as out:
        out.write(f"{job.id} {job.tube} {job.attempt} {job.raw.hex()}\n")


emails = Worker(concurrency=2)


@emails.handler("emails")
def send_email(job: Job) -> None:
    record(job)


stuck = Worker(concurrency=1, prefetch=0)


@stuck.handler("stuck")
def hang(job: Job) -> None:
    record(job)
    time.sleep(3600)


slow_bury = Worker(concurrency=1, prefetch=0)


@slow_bury.handler("reports")
def bury_after_a_while(job: Job) -> None:
    record(job)
    if job.raw == b"bury me":
        time.sleep(1.5)
        raise Bury()
