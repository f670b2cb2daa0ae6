"""zstalk native workers: a Worker pool that the broker pushes jobs to, a producer
Client, codecs, and an in-process broker for tests (zstalk.workers.testing); and the
cloud-task SDK (zstalk.workers.cloud: TaskClient, AsyncTaskClient, Functions).

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
from .passes import PassError, verify_pass
from .worker import Worker

__all__ = ["AsyncTaskClient", "Backoff", "Bury", "Client", "Functions", "Job", "Retry",
           "TaskApiError", "TaskClient", "Worker", "WorkerVersionError", "ZstalkError",
           "codecs"]

#: imported on first use: aiohttp takes a worker process's start-up longer than the
#: rest of this package together
_CLOUD = ("AsyncTaskClient", "Functions", "TaskApiError", "TaskClient")


def __getattr__(name: str):
    if name in _CLOUD:
        from . import cloud
        return getattr(cloud, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
