"""The ready set of a tube against the plainest model of beanstalkd's order: a sorted
list of (pri, id), driven by random adds and removes."""
from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedList

from zstalk.broker.core.beanstalk.jobs import Job, ReadySet, Tube, ready_key

# (add?, pri, id): few priorities and ids, so removes hit and priorities share buckets
steps = st.lists(st.tuples(st.booleans(), st.sampled_from([0, 1, 1024, 2**32 - 1]),
                           st.integers(1, 40)), max_size=200)


@given(steps)
@settings(max_examples=300, deadline=None)
def test_the_first_job_and_the_count_follow_pri_then_id_order(ops):
    ready, model = ReadySet(), set()
    for add, pri, job_id in ops:
        if add and not any(j == job_id for _, j in model):
            moved = ready.add(pri, job_id)
            model.add((pri, job_id))
            assert moved == ((pri, job_id) == min(model))     # it is the new first job
        elif not add and model:
            pri, job_id = sorted(model)[job_id % len(model)]
            moved = ready.remove(pri, job_id)
            assert moved == ((pri, job_id) == min(model))     # it was the first job
            model.remove((pri, job_id))
        else:
            continue
        first = min(model) if model else None
        assert ready.top == (None if first is None else ready_key(*first))
        assert len(ready) == len(model)


# what a queue mostly sees: ids growing (put), the first taken (reserve), taken jobs put
# back (release), and now and then one taken from anywhere (delete, reserve-job)
queue_steps = st.lists(st.tuples(st.sampled_from(["put", "put", "take", "back", "any"]),
                                 st.sampled_from([0, 5]), st.integers(0, 10**6)),
                       max_size=300)


@given(queue_steps)
@settings(max_examples=300, deadline=None)
def test_a_set_used_as_a_queue_gives_every_job_back_in_pri_then_id_order(ops):
    ready, model, taken, next_id = ReadySet(), set(), [], 1
    for what, pri, n in ops:
        if what == "put":
            ready.add(pri, next_id)
            model.add((pri, next_id))
            next_id += 1
        elif what == "back" and taken:
            job = taken.pop(n % len(taken))
            ready.add(*job)
            model.add(job)
        elif what in ("take", "any") and model:
            job = min(model) if what == "take" else sorted(model)[n % len(model)]
            ready.remove(*job)
            model.remove(job)
            taken.append(job)
    drained = []
    while ready.top is not None:
        job = (ready.top >> 64, ready.top & (2**64 - 1))
        ready.remove(*job)
        drained.append(job)
    assert drained == sorted(model) and len(ready) == 0


def test_ids_that_come_in_order_stay_in_a_deque_until_one_goes_in_the_middle():
    ready = ReadySet()
    for job_id in (5, 6, 7, 8):
        ready.add(0, job_id)
    ready.remove(0, 5)          # a reserve
    ready.add(0, 5)             # its release: back in front
    ready.remove(0, 8)          # the last
    assert type(ready.by_pri[0]) is deque and list(ready.by_pri[0]) == [5, 6, 7]
    ready.remove(0, 6)          # from the middle: sorted from now on
    ready.add(0, 6)
    assert type(ready.by_pri[0]) is SortedList and list(ready.by_pri[0]) == [5, 6, 7]
    assert ready.top == ready_key(0, 5)


def test_a_filled_set_starts_at_its_best_job_and_keeps_the_jobs_own_ids():
    t = Tube("t")
    jobs = [Job(i, t, pri, 0, 60, b"x", 0.0) for i, pri in [(7, 5), (3, 5), (9, 1), (4, 2)]]
    ready = ReadySet()
    ready.fill(jobs)
    assert ready.top == ready_key(1, 9) and len(ready) == 4
    assert ready.remove(1, 9) and ready.top == ready_key(2, 4)
    assert not ready.remove(5, 7) and ready.top == ready_key(2, 4)


def test_jobs_with_the_same_delay_and_ttr_share_one_pair():
    t = Tube("t")
    a, b = Job(1, t, 0, 0, 60, b"a", 0.0), Job(2, t, 0, 0, 60, b"b", 0.0)
    assert a.times is b.times
    b.delay_s = 5
    assert (b.delay_s, b.ttr_s, a.delay_s) == (5, 60, 0)


def test_a_job_gets_its_counters_list_only_when_something_happens_to_it():
    t = Tube("t")
    job = Job(1, t, 0, 0, 60, b"a", 0.0)
    job.holder = None
    assert job.counts is None and job.count(0) == 0 and job.holder is None
    job.bump(0)
    job.holder = "session"
    assert (job.count(0), job.holder) == (1, "session")
