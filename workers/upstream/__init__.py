"""The upstream side of the dispatcher: the process that makes the broker's cloud-task
calls over HTTP (dispatcher.py), its connection pool per upstream, kept as nginx keeps
its upstream connections (keepalive.py), and its probes for the broker's active health
checks (health_checks.py).  It is no part of the worker SDK that `zstalk.workers` exports,
and importing that package never loads this one: `zstalk dispatcher` (broker/run/fronts.py)
and `zstalk serve` (broker/run/serve.py) import `Dispatcher` from here."""
