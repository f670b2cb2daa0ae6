"""zstalk native workers: a Worker pool that the broker pushes jobs to, a producer
Client, codecs (an in-process broker for tests is zstalk.broker.testing); and the
cloud-task SDK (zstalk.workers.cloud: TaskClient, AsyncTaskClient, Functions), a client of
the counters (CounterClient), and the waiting room's pass check (verify_pass).

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

__all__ = ["AsyncTaskClient", "Backoff", "Bury", "Client", "CounterClient", "CounterError",
           "Functions", "Job", "NotAvailable", "PassError", "Retry", "TaskApiError",
           "TaskClient", "Worker", "WorkerVersionError", "ZstalkError", "codecs",
           "verify_pass"]

#: imported on first use, each from its module: aiohttp takes a worker process's start-up
#: longer than the rest of this package together, and a worker needs none of these
_LAZY = {"AsyncTaskClient": ".cloud", "Functions": ".cloud", "TaskApiError": ".cloud",
         "TaskClient": ".cloud", "CounterClient": ".counters", "CounterError": ".counters",
         "NotAvailable": ".counters", "PassError": "..protocol.codecs.passes",
         "verify_pass": ".signing"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
