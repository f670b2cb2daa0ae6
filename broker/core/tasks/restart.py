"""A restart: the tasks a journal kept, back where their statuses say.

`restore` rebuilds them in enqueue order (journal.TaskImage each, wall-clock times back
to our clock): the ledger (ledger.py) takes each and sets its status as the journal holds
it, no move; this module puts back what the other components owned for it.  A queued
online task waits in the room again, last seen at the restart.  A call running when the
broker stopped may still be running: it waits CLAIM_S (calls.py) for its dispatcher to
claim it (the store's `claim`), then ends with an unknown outcome, decided by its
deliveryMode.  An admitted task's pass holds its function's slot until it expires.  A
room event's draw (journal.RoomDraw, each function's latest) gives every online task
still queued that joined before its opening the place the draw gave it (room.py
`drawn_priority`: the seed and the task's own id, whoever else is left), so the line is
in the order it was before the restart.
"""
from __future__ import annotations

from ....protocol.schema.tasks import ADMITTED, MAX_LEVEL, QUEUED, RUNNING
from .components.calls import Calls
from .components.room import drawn_priority
from .ledger import Ledger
from .model.spec import DEFAULTS
from .model.task import Task, restored


def restore(ledger: Ledger, inflight: Calls, images: list, wall_offset: float,
            now: float, draws: list = ()) -> None:
    """The tasks a journal restored, each where its status says, a draw's members in
    their drawn places."""
    drawn = {draw.function: draw for draw in draws}
    for image in sorted(images, key=lambda image: image.seq):
        task = restored(image, wall_offset, MAX_LEVEL)
        draw = drawn.get(task.function) if task.online and image.status == QUEUED else None
        if draw is not None and image.created < draw.opens_at:  # (its createdAt as kept)
            task.place(task.level, drawn_priority(draw, task.uid))
        ledger.add(task, ledger.fns.function(task.function))
        _resume(ledger, inflight, task, image, wall_offset, now)
    if images:
        ledger.next_seq = max(t.seq for t in ledger.by_seq.values()) + 1


def _resume(ledger: Ledger, inflight: Calls, task: Task, image, wall: float,
            now: float) -> None:
    status, function = image.status, task.function
    running = status in (ADMITTED, RUNNING)
    ledger.resume(task, status, image.due - wall if status == QUEUED else None,
                  image.expires - wall if status != QUEUED and not running else None, now)
    spec = ledger.specs.get(function)
    if status == QUEUED:
        if task.online:                 # (last seen: the restart)
            task.last_seen = now
            ledger.room.join(task, spec, now)
    elif running:
        ledger.limits.running[function] = ledger.limits.running.get(function, 0) + 1
        if status == RUNNING:
            inflight.restarted(task, now)
            return
        if not task.pass_exp:           # (a TASK_STATE logged the admission: from then)
            task.pass_exp = (task.started or now) + (spec or DEFAULTS).pass_ttl_ms / 1000
        ledger.room.admitted(task)
