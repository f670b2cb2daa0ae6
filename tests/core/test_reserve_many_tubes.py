"""Reserve across more watched tubes than the queue scans directly: the best ready job of
the unpaused watched tubes, whatever sequence of puts, reserves, releases, deletes, pauses
and time brought the tubes there (queue.py keeps its index of tube tops up to date only
when such a reserve looks at it).  The pure core, a clock that moves only when told, and a
model that finds the best job by looking at every job."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from test_broker_core import Harness
from zstalk.broker.core.beanstalk.queue import _FEW_TUBES
from zstalk.protocol.schema import Op, R

TUBES = [f"t{i}" for i in range(_FEW_TUBES + 4)]
PAUSE_S = 2
PRODUCER, WORKER = 1, 2

steps = st.lists(st.one_of(
    st.tuples(st.just("put"), st.sampled_from(TUBES), st.integers(0, 5)),
    st.tuples(st.just("reserve")),
    st.tuples(st.just("release"), st.integers(0, 5)),
    st.tuples(st.just("delete")),
    st.tuples(st.just("pause"), st.sampled_from(TUBES)),
    st.tuples(st.just("wait")),
), max_size=80)


class Model:
    """Every ready job (id -> (tube, pri)) and when each tube's pause ends."""

    def __init__(self) -> None:
        self.ready: dict[int, tuple[str, int]] = {}
        self.paused_until: dict[str, float] = {}

    def best(self, now: float) -> int | None:
        keys = [(pri, job_id) for job_id, (tube, pri) in self.ready.items()
                if self.paused_until.get(tube, 0) <= now]
        return min(keys)[1] if keys else None


@settings(max_examples=150, deadline=None)
@given(steps)
def test_reserve_across_many_tubes_takes_the_best_job_of_the_unpaused_ones(script):
    h, model, held = Harness(), Model(), []
    h.open(PRODUCER, WORKER)
    h.send(*[(Op.WATCH, WORKER, tube) for tube in TUBES])
    tube_of: dict[int, str] = {}
    for step in script:
        if step[0] == "put":
            _, tube, pri = step
            h.send((Op.USE, PRODUCER, tube))
            job_id = h.put(PRODUCER, pri=pri)
            model.ready[job_id], tube_of[job_id] = (tube, pri), tube
        elif step[0] == "reserve":
            want = model.best(h.now)
            got = h.send((Op.RESERVE, WORKER, 0))
            if want is None:
                assert [r[1] for r in got] == [R.TIMED_OUT]
            else:
                assert got[0][:3] == (WORKER, R.RESERVED, want)
                del model.ready[want]
                held.append(want)
        elif step[0] == "release" and held:
            job_id = held.pop(0)
            assert h.send((Op.RELEASE, WORKER, job_id, step[1], 0)) == [(WORKER, R.RELEASED)]
            model.ready[job_id] = (tube_of[job_id], step[1])
        elif step[0] == "delete" and held:
            assert h.send((Op.DELETE, WORKER, held.pop())) == [(WORKER, R.DELETED)]
        elif step[0] == "pause":
            h.send((Op.PAUSE_TUBE, PRODUCER, step[1], PAUSE_S))
            model.paused_until[step[1]] = h.now + PAUSE_S
        elif step[0] == "wait":
            h.advance(PAUSE_S / 2 + 0.01)
