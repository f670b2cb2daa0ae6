"""The components of the task store, each the one owner of its piece of state: the lines
and the hand-out order (lines.py), the waiting room's tasks and counts (room.py), the calls
in flight (calls.py), each function's gate and recent calls (limits.py), whether a call may
start now (limiter.py), the servers of upstream calls (upstream_calls.py), timers in lanes
(deadlines.py) and the per-function counts (stats.py).  They build on ../model/; the store
(../store.py) coordinates them and is the only one that changes a task's status."""
