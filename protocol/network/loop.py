"""The event loop every zstalk process runs on: uvloop where it is installed, else asyncio's.

uvloop (libuv under asyncio's interface) takes the per-turn cost of the loop down, which is
most of what a one-command-at-a-time client waits for (scripts/bench_beanstalk.py's
"one at a time" rows).  It is a dependency on the platforms it supports; where it cannot
be installed, or with ZSTALK_LOOP=asyncio, the standard loop runs the same code.
"""
from __future__ import annotations

import asyncio
import os
from typing import Any, Coroutine


def loop_factory():
    """A new event loop of the best kind available here."""
    if os.environ.get("ZSTALK_LOOP", "") != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, Any]) -> Any:
    """asyncio.run(main) on a loop from loop_factory()."""
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(main)
