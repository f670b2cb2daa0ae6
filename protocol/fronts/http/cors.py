"""CORS on the HTTP front (the Fetch standard's "CORS protocol"): a site's own page may
enqueue, follow and end its tasks from the browser, from the origins its function lists
(`allow_origins`, broker/config_file.py).

The broker owns the config, so it sends the origins in Settings (schema version 5), and
again on SIGHUP: `allow_origins`, function -> its origins ("" for any other name under
base_url; "*": any origin), and `enqueue_origins`, those of the functions a request
without the master key can enqueue to.  Four routes take part, each with the methods
a page needs and the request headers it may send:

    route                        methods  headers a page may send   preflight judged by
    /v1/tasks                    POST     Content-Type              enqueue_origins
    /v1/tasks/{uniqueId}         GET,     Content-Type,             every function's origins
                                 DELETE   Authorization (its token)
    /v1/tasks/{uniqueId}/done    POST     Content-Type,             every function's origins
                                          Authorization (its pass),
                                          X-Zstalk-Pass
    /v1/tasks/{uniqueId}/events  GET      Authorization (its token),  every function's origins
                                          Last-Event-ID

A preflight (OPTIONS with an Origin and Access-Control-Request-Method) carries no body, so
it is judged by its route (the last column); allowed, it is answered 204 with the route's
methods and headers, which the browser may keep for MAX_AGE_S; refused (an origin, a method
or a header the route does not allow), 403 in the API's JSON and without CORS headers, so
the browser stops there.  Any other OPTIONS is answered 204 with `Allow`.

An actual request with an Origin gets Access-Control-Allow-Origin, that origin echoed,
when the function it concerns lists it: the body's for POST /v1/tasks (each of a batch's),
the TaskInfo's `function` for the others; the handlers note them (`note`).  A reply that
names none (a refusal before the function was known, a task not found) is judged as its
preflight was.  Refusals carry the header too, so the page can read why (429
too_many_waiting).  Every reply to a request with an Origin on these routes says
`Vary: Origin`.

No Access-Control-Allow-Credentials: nothing here rides on cookies.  And no master key
in a page: enqueue lets no Authorization header through, reading a task needs no key
(unless [api] private_results) or its own token, cancelling or leaving it its token
(the 201 gave the page), done takes the task's own pass.  The routes that need the key
(listing, functions, schedules) take no part, nor does verify, which is for a gateway: a
page learns its pass from its task.
"""
from __future__ import annotations

from typing import Callable, Iterable, NamedTuple

from aiohttp import web

from ...schema import Settings
from .api import Problem, refuse

MAX_AGE_S = 600     # an origin dropped by SIGHUP may still send (not read) for this long
EXPOSED = "Location, WWW-Authenticate"      # what a page may read beside the safe headers


class Route(NamedTuple):
    methods: tuple[str, ...]
    headers: tuple[str, ...]
    enqueue: bool       # a preflight is judged by enqueue_origins (else every function's)


ROUTES = {
    "/v1/tasks": Route(("POST",), ("Content-Type",), True),
    "/v1/tasks/{uniqueId}": Route(("GET", "DELETE"), ("Content-Type", "Authorization"), False),
    "/v1/tasks/{uniqueId}/done": Route(("POST",), ("Content-Type", "Authorization",
                                                   "X-Zstalk-Pass"), False),
    "/v1/tasks/{uniqueId}/events": Route(("GET",), ("Authorization", "Last-Event-ID"), False),
}
_NOTED = web.RequestKey("zstalk_cors_functions", tuple)


# -- the rules: Settings and header values in, a verdict out --------------------------------
def listed(origin: str, origins: Iterable[str]) -> bool:
    return any(o == origin or o == "*" for o in origins)


def function_origins(settings: Settings, function: str) -> list[str]:
    """The origins `function` allows (the broker lists every named function when names
    under base_url have origins: a name it does not list is one of those)."""
    origins = settings.allow_origins
    return origins.get(function, origins.get("", []))


def preflight_origins(settings: Settings, route: Route) -> Iterable[str]:
    if route.enqueue:
        return settings.enqueue_origins
    return (o for origins in settings.allow_origins.values() for o in origins)


def preflight_refusal(settings: Settings, route: Route, origin: str, method: str,
                      asked: str) -> Problem | None:
    """Why a preflight is refused (None: it is not)."""
    if not listed(origin, preflight_origins(settings, route)):
        what = "enqueue" if route.enqueue else "read or end tasks"
        return refuse(403, f"origin {origin} may not {what} here: no function lists it in "
                           "allow_origins")
    if method not in route.methods:
        return refuse(403, f"a page may only {' or '.join(route.methods)} here, not {method}")
    allowed = {h.lower() for h in route.headers}
    extra = [h.strip() for h in asked.split(",") if h.strip().lower() not in allowed | {""}]
    if extra:
        why = " (a page enqueues without the master key)" if route.enqueue else ""
        return refuse(403, f"a page may not send {', '.join(extra)} here{why}; it may send "
                           f"{', '.join(route.headers)}")
    return None


def allowed(settings: Settings, route: Route, origin: str, functions: tuple | None) -> bool:
    """Whether a page at `origin` may read the reply to a request about `functions`."""
    if not functions:
        return listed(origin, preflight_origins(settings, route))
    return all(listed(origin, function_origins(settings, f)) for f in functions)


def note(request: web.Request, *functions: str) -> None:
    """The functions the request concerns (the handler knows them; none: not known)."""
    request[_NOTED] = functions


# -- on aiohttp ----------------------------------------------------------------------------
class Cors:
    def __init__(self, settings: Callable[[], Settings]) -> None:
        self.settings = settings

    @web.middleware
    async def middleware(self, request: web.Request, handler) -> web.StreamResponse:
        response = await handler(request)
        if not response.prepared:       # (an event stream set its own before it began)
            self.apply(request, response)
        return response

    def apply(self, request: web.Request, response: web.StreamResponse) -> None:
        """The CORS headers of the reply to an actual request, before it is sent."""
        origin = request.headers.get("Origin")
        route = _route(request)
        if origin is None or route is None or request.method == "OPTIONS":
            return
        _vary(response)
        if request.method in route.methods and allowed(self.settings(), route, origin,
                                                      request.get(_NOTED)):
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Expose-Headers"] = EXPOSED

    async def preflight(self, request: web.Request) -> web.Response:
        """OPTIONS on a route of ROUTES: a preflight, or a plain OPTIONS."""
        origin = request.headers.get("Origin")
        method = request.headers.get("Access-Control-Request-Method")
        path = request.match_info.route.resource.canonical
        if origin is None or method is None:
            methods = {r.method for resource in request.app.router.resources()
                       if resource.canonical == path for r in resource}
            return web.Response(status=204, headers={"Allow": ", ".join(sorted(methods))})
        route = ROUTES[path]
        asked = request.headers.get("Access-Control-Request-Headers", "")
        refused = preflight_refusal(self.settings(), route, origin, method, asked)
        if refused:
            return web.json_response({"error": refused.code, "message": refused.message},
                                     status=refused.status, headers={"Vary": "Origin"})
        return web.Response(status=204, headers={
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Methods": ", ".join(route.methods),
            "Access-Control-Allow-Headers": ", ".join(route.headers),
            "Access-Control-Max-Age": str(MAX_AGE_S), "Vary": "Origin"})


def _route(request: web.Request) -> Route | None:
    resource = request.match_info.route.resource
    return ROUTES.get(resource.canonical) if resource is not None else None


def _vary(response: web.StreamResponse) -> None:
    vary = response.headers.get("Vary")
    if vary is None:
        response.headers["Vary"] = "Origin"
    elif "origin" not in vary.lower():
        response.headers["Vary"] = f"{vary}, Origin"
