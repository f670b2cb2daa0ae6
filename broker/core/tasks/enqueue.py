"""Every check an enqueue passes in the broker, in one place, in the order they are made.
A refusal is a TaskError and changes nothing; the first that refuses answers.

    the op's shape              TaskEnqueue.read (protocol/schema/task_messages.py):
                                names are text, params bytes ("malformed enqueue")
    who may         `allowed`   without the master key: an online task of a function
                                whose `online` is public or only, any other task only
                                with [api] public_enqueue; and then no option, no request
    the request     `allowed`   a request task's object against its function
                                (requests.py), so its body is what counts next
    room            `room_for`  not draining; the memory (--max-jobs-bytes) has room
    the function    store       one of the config's, or a name under base_url
    the task        `new_task`  its options (options.py: a `group` too, as only the
                                master key sets options; without one, `grouped_by`:
                                its client's address with group_by = "client", a
                                header's value with "header:NAME", 400 for a value
                                no group may have), a new group within
                                the function's max_groups (429), the waiting room's rules
                                (room.py `refusal`), a uniqueId given and free, a delay
                                below its queueTimeout
    the journal     store       room for its record (the disk is not full)

The HTTP front checks a body's shape before it becomes an op (protocol/fronts/http/api.py
parse_task) and refuses early what the policy in Settings says (a keyless enqueue when
public_enqueue is off); the broker decides.  A cron schedule's fire is a master-key
enqueue: it takes `room_for` and the store's checks (core/schedules/commands.py).
"""
from __future__ import annotations

from typing import Any, Callable

from ....protocol.schema.task_messages import TaskEnqueue
from ....protocol.schema.tasks import (AT_LEAST_ONCE, DEFAULT_ATTEMPTS, DEFAULT_KEEP_RESULT_MS,
                                       GROUP)
from ..shared import Admission
from .components.room import Room
from .components.upstream_calls import UpstreamCalls
from .model import requests
from .model.options import bad, parse_options
from .model.spec import ApiPolicy, FunctionSpec
from .model.task import TASK_OVERHEAD_BYTES, Task, TaskBackoff, TaskError, client_group

NEEDS_KEY = TaskError("unauthorized", "this needs Authorization: Bearer <master key>")
#: a function's `online` that lets a request without the master key enqueue online tasks
PUBLIC_ONLINE = ("public", "only")
_NO_EXTRAS = TaskError("unauthorized", "an enqueue without the master key may set no option "
                                       "and send no request")


def allowed(order: TaskEnqueue, spec_of: Callable[[str], FunctionSpec | None], api: ApiPolicy,
            admission: Admission) -> TaskEnqueue | TaskError:
    """Who may, the request and room: the order as the store takes it (a request task's
    request parsed into (Request, body)), or why it is refused."""
    if not order.keyed:
        refused = _keyless(order, spec_of, api)
        if refused is not None:
            return refused
    size, request = len(order.params), order.request
    if request is not None:             # checked here, so its body counts for admission
        spec = spec_of(order.function)
        if spec is not None:
            request = requests.parse(request, spec.request_headers)
            if isinstance(request, str):
                return bad(request)
            size = len(request[1]) + request[0].size()
    refused = room_for(admission, size)
    if refused is not None:
        return refused
    return order if request is order.request else order._replace(request=request)


def _keyless(order: TaskEnqueue, spec_of, api: ApiPolicy) -> TaskError | None:
    if order.online:        # the function's `online` decides, not [api] public_enqueue
        spec = spec_of(order.function)
        if spec is None or spec.online not in PUBLIC_ONLINE:
            return NEEDS_KEY
    elif not api.public_enqueue:
        return NEEDS_KEY
    if order.options or order.request is not None:
        return _NO_EXTRAS
    return None


def keyless_enqueue(spec: FunctionSpec, api: ApiPolicy) -> bool:
    """Whether a request without the master key can enqueue any task of `spec`."""
    return spec.online in PUBLIC_ONLINE or (api.public_enqueue and spec.online != "only")


def client_ip(order: TaskEnqueue, api: ApiPolicy) -> str | None:
    """The enqueuer's address the HTTP front saw, or the first X-Forwarded-For hop it
    passed when the config trusts it ([api] trust_forwarded)."""
    return (order.forwarded if api.trust_forwarded else None) or order.client


def room_for(admission: Admission, params_len: int) -> TaskError | None:
    """Why no new task may come in now, if so (draining, memory)."""
    if admission.draining:
        return TaskError("draining", "the server is draining: no new tasks")
    if not admission.room_for(TASK_OVERHEAD_BYTES + params_len):
        return TaskError("out_of_memory", "the memory for jobs and tasks "
                                          f"(--max-jobs-bytes {admission.limit}) is used up")
    return None


def new_task(spec: FunctionSpec, params: bytes, options: Any, now: float, uid: str | None,
             request: Any, client_ip: str | None, online: bool, *, seq: int,
             wall_offset: float, taken: dict, room: Room,
             upstream: UpstreamCalls, groups: dict | None = None,
             headers: dict | None = None,
             token: bytes | None = None) -> Task | TaskError:
    """The task an enqueue makes, every check of the task made (nothing changed yet).
    `request`: unchecked, or (Request, body) as requests.parse made it; `taken`: the
    tasks by uniqueId; `groups`: the function's named groups with live tasks (the
    ledger's counts); `headers`: the group headers' values the front saw."""
    if request is not None:
        checked = request if isinstance(request, tuple) else requests.parse(
            request, spec.request_headers)
        if isinstance(checked, str):
            return bad(checked)
        request, params = checked
    parsed = parse_options(options, spec)
    if isinstance(parsed, TaskError):
        return parsed
    group = parsed.get("group")
    if group is None and spec.group_by:         # (the option wins)
        group = grouped_by(spec, client_ip, headers)
        if isinstance(group, TaskError):
            return group
        if group:
            parsed["group"] = group
        else:
            group = None
    if group is not None and groups and group not in groups and len(groups) >= spec.max_groups:
        return TaskError("too_many_groups", f"{spec.name!r} has tasks of {len(groups)} groups, "
                         f"its max_groups: a task of another waits until one has none left")
    refused = room.refusal(spec, parsed, online, client_ip)
    if refused is not None:
        return refused
    uid = parsed.get("uniqueId", uid)
    if uid is None:
        return TaskError("bad_request", "a uniqueId is needed")
    if uid in taken:
        return TaskError("duplicate", f"a task with uniqueId {uid!r} exists")
    queue_timeout_ms = parsed.get("queueTimeout", spec.queue_timeout_ms)
    if queue_timeout_ms and parsed.get("delay", 0) >= queue_timeout_ms:
        return bad(f"delay ({parsed['delay']} ms) must be below queueTimeout "
                   f"({queue_timeout_ms} ms): the task would time out before it ran")
    priority = parsed.get("priority", int((now + wall_offset) * 1000))
    task = Task(uid, spec.name, params, priority, seq, now)
    task.request, task.client_ip, task.token = request, client_ip, token
    if online:
        task.online, task.last_seen = True, now
    if spec.upstream in upstream.keyed:
        task.balance_key = upstream.balance_key(spec.upstream, uid, params, client_ip)
    task.place(parsed.get("level", 0), priority)
    if queue_timeout_ms:
        task.queue_deadline = now + queue_timeout_ms / 1000
    _set_options(task, parsed, spec, now)
    return task


def grouped_by(spec: FunctionSpec, client_ip: str | None,
               headers: dict | None) -> str | TaskError:
    """The group `spec.group_by` puts a task enqueued without the option `group` in ("":
    none): its client's address ("client"), or the value of the header it names
    ("header:NAME": a gateway's, which overwrites what a client sent; none without the
    header, 400 for a value no group may have)."""
    header = spec.group_header
    if header is None:
        return client_group(client_ip)
    value = headers.get(header) if headers else None
    if value is None:
        return ""
    if GROUP.fullmatch(value) is None:
        return bad(f"the header {spec.group_by[7:]} names the task's group: 1 to 64 "
                   f"characters of A-Z a-z 0-9 _ . : @ -")
    return value


def _set_options(task: Task, parsed: dict, spec: FunctionSpec, now: float) -> None:
    """The options that take their defaults from the API's (and the function's)."""
    task.attempts = parsed.get("attempts", DEFAULT_ATTEMPTS)
    task.backoff = parsed.get("backoff", TaskBackoff())
    task.timeout_ms = parsed.get("timeout", spec.timeout_ms)
    task.delivery = parsed.get("deliveryMode", AT_LEAST_ONCE)
    task.keep_result_ms = parsed.get("keepResult", DEFAULT_KEEP_RESULT_MS)
    task.due = now + parsed.get("delay", 0) / 1000
    task.group = parsed.get("group", "")
