"""The dashboard's own routes (issue 50): the log-in that hands out its cookie, and the page.

    GET  /ui/                                             the page (dashboard_page/; /ui: 308 to it)
    GET  /ui/assets/{name}                                its script and its style
    POST /ui/login    {"key": "<master or viewer key>"}  -> {"role"} and the cookie
    POST /ui/logout                                       -> the cookie cleared
    GET  /ui/session                                      -> {"role", "keyed"}

How it works: the keys and the cookie's rules are access.py's; this module only turns them
into responses.  The cookie is HttpOnly (no script reads it), SameSite=Strict (no other
site's page sends it), Secure on HTTPS, Path=/ and good for COOKIE_TTL_S.  A log-in body
must be JSON (Content-Type: application/json), which no HTML form can send.  A client
address that gives MAX_FAILURES wrong keys within WINDOW_S waits (429 too_many_logins,
Retry-After): a key is not found by trying.  Without a
master key nobody logs in: every loopback client is the master (`keyed` false says so).

The page is three files in the package (dashboard_page/), read once when the front starts
and served from memory with a Content-Security-Policy that allows this origin's script,
style and requests and nothing else (no inline script or style, no frames: CSP below),
nosniff and no referrer.  Nothing is built and nothing comes from another site.
"""
from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Awaitable, Callable

from aiohttp import web

from .access import COOKIE, COOKIE_TTL_S, MASTER, NOBODY, Keys
from .api import STATUS, Problem, refuse


PAGE_DIR = Path(__file__).with_name("dashboard_page")
#: the page's files: name -> content type ("index.html" is GET /ui/)
FILES = {"index.html": "text/html", "dashboard.js": "text/javascript",
         "dashboard.css": "text/css"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY",
                "Cache-Control": "no-cache"}


#: wrong keys a client address may try in WINDOW_S before its log-ins wait (429)
MAX_FAILURES, WINDOW_S, MAX_CLIENTS = 10, 60.0, 10_000
TOO_MANY_LOGINS = Problem(STATUS["too_many_logins"], "too_many_logins",
                          f"{MAX_FAILURES} wrong keys from this address within "
                          f"{WINDOW_S:.0f} s: try again later")


class Failures:
    """Wrong keys by client address, the last WINDOW_S of them (pure: the clock is
    passed in); the addresses least recently wrong are forgotten beyond MAX_CLIENTS."""

    def __init__(self) -> None:
        self.seen: collections.OrderedDict[str, list[float]] = collections.OrderedDict()

    def allowed(self, client: str, now: float) -> bool:
        recent = [t for t in self.seen.get(client, ()) if t > now - WINDOW_S]
        return len(recent) < MAX_FAILURES

    def failed(self, client: str, now: float) -> None:
        recent = [t for t in self.seen.pop(client, ()) if t > now - WINDOW_S]
        self.seen[client] = recent + [now]
        while len(self.seen) > MAX_CLIENTS:
            self.seen.popitem(last=False)


def page_files() -> dict[str, bytes]:
    return {name: (PAGE_DIR / name).read_bytes() for name in FILES}


class Ui:
    """The routes over the front's keys, `json_body` (a request's JSON body, or its
    Problem) and `respond` (a Problem as the response)."""

    def __init__(self, keys: Keys, json_body: Callable[[web.Request], Awaitable],
                 respond: Callable[[Problem], web.Response]) -> None:
        self.keys, self.json_body, self.respond = keys, json_body, respond
        self.files = page_files()
        self.failures = Failures()

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/ui", self.to_index)
        app.router.add_get("/ui/", self.index)
        app.router.add_get("/ui/assets/{name}", self.asset)
        app.router.add_post("/ui/login", self.login)
        app.router.add_post("/ui/logout", self.logout)
        app.router.add_get("/ui/session", self.session)

    async def to_index(self, request: web.Request) -> web.Response:
        """/ui, as a person types it: the page is /ui/ (its assets are relative to it)."""
        return web.Response(status=308, headers={"Location": "/ui/"})

    async def index(self, request: web.Request) -> web.Response:
        return self._file("index.html")

    async def asset(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name == "index.html" or name not in self.files:
            return self.respond(refuse(404, f"no {name!r} here"))
        return self._file(name)

    def _file(self, name: str) -> web.Response:
        return web.Response(body=self.files[name], headers=PAGE_HEADERS,
                            content_type=FILES[name], charset="utf-8")

    async def login(self, request: web.Request) -> web.Response:
        doc = await self.json_body(request)
        if isinstance(doc, Problem):
            return self.respond(doc)
        if not isinstance(doc, dict) or set(doc) != {"key"} or type(doc["key"]) is not str:
            return self.respond(refuse(400, 'the body must be {"key": "<master or viewer key>"}'))
        if self.keys.master is None:
            return web.json_response({"role": MASTER})
        client, now = request.remote or "", time.monotonic()
        if not self.failures.allowed(client, now):
            return self.respond(TOO_MANY_LOGINS)
        role = self.keys.login(doc["key"])
        if role is None:
            self.failures.failed(client, now)
            return self.respond(refuse(403, "that is neither the master key nor the viewer key"))
        response = web.json_response({"role": role})
        response.set_cookie(COOKIE, self.keys.cookie(role, time.time()), max_age=COOKIE_TTL_S,
                            path="/", httponly=True, samesite="Strict", secure=request.secure)
        return response

    async def logout(self, request: web.Request) -> web.Response:
        response = web.json_response({"role": NOBODY})
        response.del_cookie(COOKIE, path="/")
        return response

    async def session(self, request: web.Request) -> web.Response:
        """Who this request is (a wrong bearer key: 403), and whether keys are needed."""
        who = self.keys.who(request.method, request.headers, time.time())
        if isinstance(who, Problem):
            return self.respond(who)
        return web.json_response({"role": who, "keyed": self.keys.master is not None},
                                 headers={"Cache-Control": "no-store"})
