"""The OpenAPI document (protocol/fronts/http/openapi.py) is kept true three ways: it is valid OpenAPI
3.1 and names exactly the routes the front serves; its option schemas accept exactly what
broker/core/tasks/store.py parse_options accepts (a property test); and schemathesis drives a real
`zstalk serve --master-key` from the document that server serves, with no 5xx and every
status code, content type and body one the document names."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import aiohttp
import jsonschema_rs
import pytest
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.errors import Flaky
from schemathesis import GenerationMode

from servers import LOOPBACK, ServerProcess, find_zstalk, free_port, self_check
from test_tasks_end_to_end import FunctionHost as TaskFunctionHost
from zstalk.broker.core.tasks.store import (INT64, MAX_ATTEMPTS, MAX_DURATION_MS,
                                            MAX_TIMEOUT_MS, OPTIONS, STATUSES, FunctionSpec,
                                            TaskError, parse_options)
from zstalk.protocol.fronts.http.front import HttpFront
from zstalk.protocol.fronts.http.openapi import PATH, document

KEY = "openapi-test-key"
WAIT_S = 10.0


def schema_of(name: str) -> jsonschema_rs.Validator:
    """A validator for one of the document's component schemas, its $refs resolved."""
    doc = document()
    return jsonschema_rs.Draft202012Validator(
        {"$ref": f"#/components/schemas/{name}", "components": doc["components"]})


# -- the document itself --------------------------------------------------------------------
def test_the_document_is_valid_openapi_3_1_and_every_schema_in_it_is_valid_json_schema():
    doc = document()
    assert doc["openapi"].startswith("3.1")
    schemathesis.openapi.from_dict(doc).validate()      # against OpenAPI 3.1's own schema
    for name in doc["components"]["schemas"]:
        schema_of(name)         # a bad keyword value or a $ref to nothing raises here
    assert json.loads(json.dumps(doc)) == doc, "plain JSON: served as it is built"


def test_the_document_names_exactly_the_routes_the_front_serves():
    app = HttpFront("tcp://127.0.0.1:1", link=object()).app()
    served = {(route.method.lower(), route.resource.canonical) for route in app.router.routes()
              if route.method != "HEAD"}          # (aiohttp's GET routes also answer HEAD)
    documented = {(method, path) for path, item in document()["paths"].items()
                  for method in item}
    assert served == documented


def test_the_document_names_every_option_and_status_the_broker_knows():
    schemas = document()["components"]["schemas"]
    assert set(schemas["TaskOptions"]["properties"]) == set(OPTIONS)
    assert set(schemas["TaskInfo"]["properties"]["status"]["enum"]) == STATUSES


# -- the option schemas against the broker's own checks -------------------------------------
def _edges(*bounds: int) -> st.SearchStrategy[int]:
    """Integers on and around the given bounds, and anywhere."""
    near = [b + d for b in bounds for d in (-1, 0, 1)]
    return st.sampled_from(near) | st.integers(min_value=INT64[0] * 2, max_value=INT64[1] * 2)


# (no 1.0: JSON Schema cannot tell it from 1, and the broker refuses it; the document says so)
_ANY = (st.none() | st.booleans() | st.text(max_size=3) | st.just(1.5) | st.just([])
        | st.just({}))
_DURATION = _edges(0, MAX_DURATION_MS) | _ANY
_OPTION_VALUES = {
    "attempts": _edges(0, MAX_ATTEMPTS) | _ANY,
    "backoff": _DURATION | st.dictionaries(
        st.sampled_from(["type", "delay", "maxDelay", "jitter", "jiggle"]),
        st.sampled_from(["fixed", "exponential", "linear"]) | st.booleans() | _DURATION,
        max_size=4),
    "delay": _DURATION,
    "deliveryMode": st.sampled_from(["atLeastOnce", "atMostOnce", "exactlyOnce"]) | _ANY,
    "keepResult": _DURATION,
    "priority": _edges(*INT64) | _ANY,
    "timeout": _edges(1, MAX_TIMEOUT_MS) | _ANY,
    "uniqueId": st.from_regex(r"[A-Za-z0-9_.:-]{0,34}\n?", fullmatch=True)
    | st.text(max_size=33) | _ANY,
    "colour": _ANY,
}


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(_OPTION_VALUES)), st.none(), max_size=4).flatmap(
    lambda keys: st.fixed_dictionaries({k: _OPTION_VALUES[k] for k in keys})))
def test_the_option_schema_accepts_exactly_what_the_broker_accepts(options):
    accepted = not isinstance(parse_options(options, FunctionSpec("f", "http://x")), TaskError)
    assert schema_of("TaskOptions").is_valid(options) == accepted, options


# -- the front serves it --------------------------------------------------------------------
class _NoBroker:
    """A link that is never needed: the document is served without the broker."""
    def start(self): pass
    def submit(self, op): raise AssertionError(f"the document needs no broker op: {op!r}")
    def flush_now(self): pass
    def close(self): pass


def test_the_front_serves_the_document_without_a_key_but_only_to_loopback_without_one():
    async def main(master_key):
        front = HttpFront("tcp://127.0.0.1:1", master_key=master_key, link=_NoBroker())
        sock = socket.create_server((LOOPBACK, 0))
        await front.start([sock])
        base = f"http://{LOOPBACK}:{sock.getsockname()[1]}"
        try:
            async with aiohttp.ClientSession(base) as client:
                answers = []
                for host in ("localhost", "attacker.example"):
                    async with client.get(PATH, headers={"Host": host}) as response:
                        answers.append((response.status, response.content_type,
                                        await response.json()))
                return answers
        finally:
            await front.close()

    (ok, body_type, body), (denied, _, refusal) = asyncio.run(main(None))
    assert (ok, body_type, body) == (200, "application/json", document())
    assert denied == 403 and "loopback" in refusal["message"]
    assert [status for status, _, _ in asyncio.run(main(KEY))] == [200, 200]


# -- a real server, driven from the document it serves ---------------------------------------
class FunctionHost(TaskFunctionHost):
    """The functions the tasks call (test_tasks_end_to_end's host); the answer depends on
    the name, so tasks end every way: JSON result, text result, failure."""

    async def handle(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        kind = len(name) % 3
        if kind == 0:
            return web.json_response({"called": name, "params": await request.json()})
        if kind == 1:
            return web.Response(text=f"plain text from {name}")
        return web.Response(status=500, text="boom")


def _request(base: str, method: str, path: str, body=None, key: str | None = KEY):
    req = urllib.request.Request(base + path, method=method,
                                 data=None if body is None else json.dumps(body).encode())
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """`zstalk serve --master-key` with functions under a FunctionHost; its HTTP base URL.
    The task the document's example uniqueId names exists (delayed, so it can be read and
    cancelled), as do tasks in every finished state."""
    if self_check():
        pytest.skip("needs zstalk")
    config = tmp_path_factory.mktemp("openapi") / "zstalk.toml"
    with FunctionHost() as host:
        config.write_text(f'[functions]\nbase_url = "http://{LOOPBACK}:{host.port}/fn"\n')
        port, http_port = free_port(), free_port()
        server = ServerProcess([find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(port),
                                "--counter-port", "0", "--worker-bind", "none",
                                "--config", str(config), "--http-port", str(http_port),
                                "--master-key", KEY], (LOOPBACK, port), name="zstalk-openapi")
        with server.start():
            base = f"http://{LOOPBACK}:{http_port}"
            _wait_answering(base, server)
            _request(base, "POST", "/v1/tasks", {"function": "closeOrder", "options": {
                "uniqueId": "order-1234", "delay": 600000}})
            _request(base, "POST", "/v1/tasks", [  # (the host answers by name length)
                {"function": name, "options": {"attempts": 0, "uniqueId": f"done-{kind}"}}
                for name, kind in (("abc", "json"), ("abcd", "text"), ("abcde", "fail"))])
            yield base


def _wait_answering(base: str, server: ServerProcess) -> None:
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            _request(base, "GET", PATH)
            return
        except (urllib.error.URLError, ConnectionError):
            assert time.monotonic() < deadline, "no HTTP API:\n" + server.output()
            time.sleep(0.05)


def test_the_server_serves_exactly_the_document_with_no_key(api):
    assert _request(api, "GET", PATH, key=None) == (200, document())


@pytest.fixture(scope="module")
def live_schema(api):
    """The schema as the live server serves it, requests going to that server with the key."""
    config = schemathesis.Config.from_dict({
        "base-url": api, "headers": {"Authorization": f"Bearer {KEY}"},
        "generation": {"database": "none"}})
    return schemathesis.openapi.from_url(api + PATH, config=config)


CHECKS = [schemathesis.checks.not_a_server_error, schemathesis.checks.status_code_conformance,
          schemathesis.checks.content_type_conformance,
          schemathesis.checks.response_schema_conformance]
#: tasks the `api` fixture made: one waiting, and one finished each way
KNOWN_IDS = ["order-1234", "done-json", "done-text", "done-fail"]


def cases(operation) -> st.SearchStrategy:
    """Valid requests and invalid ones, as schemathesis makes them from the document, and
    requests for the tasks that exist (random ids hardly ever name one)."""
    made = [operation.as_strategy(mode) for mode in (GenerationMode.POSITIVE,
                                                     GenerationMode.NEGATIVE)]
    if "{uniqueId}" in operation.path:
        made += [operation.as_strategy(path_parameters={"uniqueId": uid}) for uid in KNOWN_IDS]
    return st.one_of(made)


# One test per documented operation, each a Hypothesis run over schemathesis's strategies.
# (Not `schemathesis.pytest.from_fixture(...).parametrize()`: schemathesis 4.32 reads
# pytest's private `Function._nodeid`, which pytest 9.2 no longer has.)
@pytest.mark.parametrize("method, path", [(method.upper(), path) for path, item in
                                          document()["paths"].items() for method in item])
def test_every_answer_of_the_real_server_is_one_its_document_names(live_schema, method, path):
    # (the dashboard's stream never ends: each valid request waits out its timeout, so
    # it gets a few examples and a short wait; its refusals come at once all the same)
    endless = path == "/v1/dashboard/events"

    @settings(max_examples=8 if endless else 50, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=cases(live_schema[path][method]))
    def run(case):
        case.call_and_validate(checks=CHECKS, timeout=2 if endless else 10)

    run()


def test_tasks_followed_through_the_documents_links_answer_as_documented(live_schema):
    """Stateful: enqueue, then read and cancel what the 201 named (its links), in random
    sequences, each answer checked as above."""
    failures = []

    class Scenarios(live_schema.as_state_machine()):
        def validate_response(self, response, case, additional_checks=None, **kwargs):
            try:
                case.validate_response(response, checks=CHECKS, transport_kwargs=kwargs)
            except Exception as exc:
                failures.append(exc)
                raise

    try:
        Scenarios.run(settings=settings(max_examples=30, stateful_step_count=6, deadline=None,
                                        database=None, suppress_health_check=list(HealthCheck)))
    except Flaky:
        # The server keeps what earlier scenarios did (a uniqueId once taken is a 409), so
        # Hypothesis replaying a scenario may find other rules enabled.  Every answer was
        # still checked: only a failed check is a finding (as schemathesis's runner has it).
        if failures:
            raise failures[0] from None
