"""The waiting room on the HTTP front (issue 31): the pass an admitted online task's user
gets, `POST /v1/tasks/{id}/done`, and `GET /v1/passes/verify` for a gateway.

The broker keeps the fields a pass is made of (the task's id, its function, when its
admission ends) and holds no key; every front signs the same pass from them with the
first key of its pass key file (`--pass-key-file`, ZSTALK_PASS_KEY_FILE: `kid:key`
lines, protocol/codecs/passes.py), read again whenever the file changes, so a rotation
needs no restart.  Without a key file the room still admits, but no pass is issued (the
TaskInfo says so), and verify refuses every pass (403 no_keys).

    GET  /v1/tasks/{id}         an admitted task's info carries `pass` (and `admitUrl`
                                with the pass in its fragment, never its query: a
                                fragment does not leave the browser in Referer or logs)
    POST /v1/tasks/{id}/done    with its pass (Bearer or X-Zstalk-Pass) or the master key:
                                the user is through, the slot goes to the next in line
    GET  /v1/passes/verify      protocol/fronts/http/pass_check.py: 204, 401 or 403 as nginx's
                                auth_request wants; revocation (done, cancelled) is asked
                                of the broker, and while it is away (not reached yet,
                                stopping on SIGTERM, stopped or lost) the signature and
                                the expiry decide at once (X-Zstalk-Pass-Check: offline)
"""
from __future__ import annotations

import os
import time
from typing import Awaitable, Callable

from aiohttp import web

from ...codecs.passes import PassError, PassKeys, check_pass, sign_pass
from ...network.pass_keys import as_pass_keys
from ...schema import R
from . import pass_check
from .api import Problem, refuse

ENV_PASS_KEY_FILE = "ZSTALK_PASS_KEY_FILE"
NO_KEYS = "no pass key file: give --pass-key-file (or ZSTALK_PASS_KEY_FILE)"


class Room:
    def __init__(self, key_file: str | None = None) -> None:
        self.key_file = key_file or os.environ.get(ENV_PASS_KEY_FILE) or None
        if self.key_file:
            self.keys()                 # a file that cannot be used fails at start, named

    def keys(self) -> PassKeys | None:
        if not self.key_file:
            return None
        return as_pass_keys(self.key_file)      # (read again only when the file changed)

    def with_pass(self, info: dict) -> dict:
        """A TaskInfo as its user sees it: an admitted task's pass, if keys are set."""
        if info.get("status") != "admitted" or "passExpiresAt" not in info:
            return info
        keys = self.keys()
        if keys is None:
            return {**info, "passError": NO_KEYS}
        token = sign_pass(keys, info["uniqueId"], info["function"], int(info["passExpiresAt"]))
        out = {**info, "pass": token}
        if info.get("admitUrl"):
            out["admitUrl"] = f"{info['admitUrl']}#zstalk_pass={token}"
        return out

    def done_refusal(self, request: web.Request, uid: str, keyed: bool) -> Problem | None:
        """Why this request may not end task `uid` (None: it may): the master key, or a
        good pass of that very task."""
        if keyed:
            return None
        keys = self.keys()
        token = pass_check.find_pass(request.headers)
        if keys is None or not token:
            return refuse(pass_check.STATUS["missing"], "done needs the task's pass "
                                                       "(Authorization: Bearer) or the master key")
        try:
            if check_pass(token, keys, time.time()) == uid:
                return None
        except PassError as exc:        # (the statuses of pass_check's one table)
            return refuse(pass_check.STATUS[exc.reason], f"the pass is no good: {exc.reason}")
        return refuse(pass_check.STATUS["wrong_task"], pass_check.MESSAGES["wrong_task"])

    async def verify(self, request: web.Request, broker_ready: bool,
                     ask: Callable[[str], Awaitable[tuple]]) -> web.Response:
        keys = self.keys()
        if keys is None:            # (no pass can be good here: fail closed, and say why)
            return web.json_response({"error": "no_keys", "message": NO_KEYS}, status=403,
                                     headers={pass_check.ERROR_HEADER: "no_keys",
                                              "Cache-Control": "no-store"})
        verdict = pass_check.check_request(request.headers, request.query, keys, time.time())
        if verdict.uid_to_check is not None:
            admitted = None
            if broker_ready:            # (else a question would wait for the next broker)
                reply = await ask(verdict.uid_to_check)
                if reply[1] == R.T_TASK:
                    admitted = reply[2].get("status") == "admitted"
                elif reply[1] == R.T_ERROR and reply[2] == "not_found":
                    admitted = False        # (long gone: done or cancelled before)
            verdict = pass_check.settle(verdict, admitted)
        return web.Response(status=verdict.status, body=verdict.body or None,
                            headers=verdict.headers)
