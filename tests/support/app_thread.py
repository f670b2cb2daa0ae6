"""An aiohttp app on its own event loop in a thread, on a free loopback port: the function
hosts the end-to-end tests call.  A subclass adds its routes in `routes(app)`; use it as
a context manager (started and listening inside, stopped after)."""
from __future__ import annotations

import asyncio
import threading

from aiohttp import web

from servers import LOOPBACK, free_port


class AppThread:
    def __init__(self, ssl_context=None) -> None:
        self.ssl_context = ssl_context      # serve https:// with it
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        self.routes(app)
        runner = web.AppRunner(app)
        self.loop.run_until_complete(runner.setup())
        self.loop.run_until_complete(web.TCPSite(runner, LOOPBACK, self.port,
                                                 ssl_context=self.ssl_context).start())
        self.ready.set()
        self.loop.run_forever()

    def __enter__(self):
        self.thread.start()
        assert self.ready.wait(10), "the function host did not start"
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
