"""GET /v1/passes/verify as data (issue 31): a request's headers and query in, a `Verdict`
out, with no HTTP server in sight.  It is shaped for nginx's `auth_request`, which lets a
request through on any 2xx and passes 401 and 403 on to the client.

How it works.  `check_request` finds the pass, in `Authorization: Bearer <pass>` or in
`X-Zstalk-Pass` (two passes that differ, in either or both, are malformed: the check
must not guess which one the API will read), never in the query (it would land in access logs).  It checks it
with the codec (protocol/codecs/passes.py: syntax, key, signature, expiry, then the
function of `?function=`; an empty `function=` names no function, so it matches none and
the check fails closed rather than open).  A refusal is final; a pass that holds up comes
back as a pending 204 whose `uid_to_check` is the task the front must ask the broker
about, as only the broker knows whether a task was done or cancelled before its pass
expired.  `settle(verdict, admitted)` then gives the answer:

    admitted True    204, X-Zstalk-Pass-Check: broker
    admitted False   403 revoked
    admitted None    204, X-Zstalk-Pass-Check: offline (the broker is away)

When the broker is away the front falls back to the signature and the expiry, the same
guarantee an offline `zstalk.workers.verify_pass` gives: a pass is signed by a key only
the fronts hold and lives at most the function's `pass_ttl`, so a revoked pass is let
through for at most that long, while refusing every pass would close the protected API
for as long as the broker is away.  The header says which check was made, so a gateway
that prefers to fail closed can refuse `offline` (nginx: auth_request_set, then a map).

Every answer is uncacheable (no-store); a 204 names the task (X-Zstalk-Task-Id), for the
gateway to hand to the API; a refusal carries a JSON body in the API's error shape
({"error", "message"}, as protocol/fronts/http/front.py answers) and its reason in
X-Zstalk-Pass-Error, since nginx drops an auth subrequest's body but can copy a header.
A 401 says `WWW-Authenticate: Bearer` (RFC 6750 section 3), with error="invalid_token"
when a pass was given.
"""
from __future__ import annotations

import json
from typing import Mapping, NamedTuple

from ...codecs.passes import REASONS, PassError, PassKeys, check_pass

PASS_HEADER = "X-Zstalk-Pass"
TASK_HEADER = "X-Zstalk-Task-Id"
CHECK_HEADER = "X-Zstalk-Pass-Check"
ERROR_HEADER = "X-Zstalk-Pass-Error"

#: every refusal with its status: 401 when there is no pass to speak of, 403 when there
#: is one and it is no good here
STATUS = {
    "missing": 401,
    "malformed": 401,
    "unknown_kid": 403,
    "forged": 403,
    "expired": 403,
    "wrong_function": 403,
    "wrong_task": 403,      # (POST /v1/tasks/{uniqueId}/done: room.py)
    "revoked": 403,
}

MESSAGES = {**REASONS, "missing": "a pass is needed (Authorization: Bearer, or X-Zstalk-Pass)",
            "revoked": "the pass's task is done or cancelled",
            "wrong_task": "the pass is another task's"}


class Verdict(NamedTuple):
    """An answer to GET /v1/passes/verify.  `uid_to_check` is set on a 204 that still
    needs the broker's word (pass it and the broker's answer to `settle`)."""
    status: int
    body: bytes
    headers: dict[str, str]
    uid_to_check: str | None = None


def check_request(headers: Mapping[str, str], query: Mapping[str, str], keys: PassKeys,
                  now: float) -> Verdict:
    """The verdict on a request, before the broker is asked about revocation."""
    token = find_pass(headers)
    if token is None:
        return refusal("missing")
    try:
        uid = check_pass(token, keys, now, query.get("function"))
    except PassError as exc:
        return refusal(exc.reason)
    return Verdict(204, b"", {"Cache-Control": "no-store", TASK_HEADER: uid}, uid)


def settle(verdict: Verdict, admitted: bool | None) -> Verdict:
    """The final verdict once the broker said whether the task is still admitted (None:
    the broker could not be asked)."""
    if verdict.uid_to_check is None:
        return verdict
    if admitted is False:
        return refusal("revoked")
    checked = "broker" if admitted else "offline"
    return verdict._replace(headers={**verdict.headers, CHECK_HEADER: checked}, uid_to_check=None)


def refusal(reason: str) -> Verdict:
    status = STATUS[reason]
    body = json.dumps({"error": reason, "message": MESSAGES[reason]}).encode()
    headers = {"Content-Type": "application/json", "Cache-Control": "no-store",
               ERROR_HEADER: reason}
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer' if reason == "missing" else 'Bearer error="invalid_token"'
    return Verdict(status, body, headers)


def find_pass(headers: Mapping[str, str]) -> str | None:
    """The pass a request carries; None when it carries none, "" (malformed) when it
    carries two that differ.  Header names are matched without case, so a CIMultiDict
    (every value of a repeated header) or a plain dict will do."""
    found = set()
    for name, value in headers.items():
        name = name.lower()
        if name == "authorization":
            scheme, _, rest = value.strip().partition(" ")
            if scheme.lower() == "bearer":
                found.add(rest.strip())
        elif name == _PASS_HEADER_LOWER:
            found.add(value.strip())
    if not found:
        return None
    return found.pop() if len(found) == 1 else ""


_PASS_HEADER_LOWER = PASS_HEADER.lower()
