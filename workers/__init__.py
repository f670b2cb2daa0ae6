"""zstalk native workers: a Worker pool that the broker pushes jobs to, a producer
Client, codecs, and an in-process broker for tests (zstalk.workers.testing).

    from zstalk.workers import Worker, Client, codecs

    worker = Worker("tcp://127.0.0.1:11400", concurrency=8, codec=codecs.json)

    @worker.handler("emails")
    def send(job):
        ...                     # return: deleted; raise: retried with backoff, then buried

    worker.run()                # or: zstalk worker mymodule:worker --processes 4
"""
from . import codecs
from .client import Client
from .errors import Bury, Retry, WorkerVersionError, ZstalkError
from .job import Backoff, Job
from .worker import Worker

__all__ = ["Backoff", "Bury", "Client", "Job", "Retry", "Worker", "WorkerVersionError",
           "ZstalkError", "codecs"]
