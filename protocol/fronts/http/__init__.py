"""The HTTP/JSON front: the task API, schedules, the waiting room and its pass check, on
aiohttp.  Its requests and answers are data (api.py: parsing, validation, the one table of
statuses), the handlers only move bytes between those and the broker (front.py); CORS
(cors.py), the waiting room (room.py, pass_check.py), schedules (schedules.py), the
server's limits and TLS (site.py) and the OpenAPI document (openapi.py) each have a module.

Importing this package loads no aiohttp: `HttpFront` comes from front.py on first use.
"""


def __getattr__(name: str):
    if name == "HttpFront":
        from .front import HttpFront
        return HttpFront
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
