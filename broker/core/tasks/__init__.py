"""Cloud tasks: functions called over HTTP (the cron schedules that enqueue them are in
core/schedules/).

Three rooms, each building only on the ones before it (tests/project/test_layout.py holds
them to it):

    model/        what a task and a function are, and the pure rules over them: task.py
                  (a task, and MOVES, the one table of its status moves), spec.py (a
                  function's spec), functions.py, options.py (an enqueue's options),
                  outcomes.py (`decide`: what an outcome does), requests.py
    components/   each the one owner of its state, returning data and calling nothing
                  back: lines.py (the lines and the hand-out order; rotation.py,
                  a line whose tasks have groups: served in turn), room.py (who waits
                  online; room events: a pre-line's draw, closed, max_waiting),
                  calls.py (calls in flight), limits.py and limiter.py (when a
                  function may call), group_limits.py (when a group of it may),
                  upstream_calls.py (which server), deadlines.py
                  (timers), stats.py (counts)
    here          the coordinators: store.py takes the ops and calls down; ledger.py is
                  the only writer of a task's status; waiting.py (the waiting room's
                  flow), restart.py (a journal's tasks back), enqueue.py (every check an
                  enqueue passes); commands.py (the broker's side of the ops, sessions
                  and feeding dispatchers) and views.py (what the API shows)

To add a feature, read in this order: task.py's MOVES and spec.py (what exists), store.py's
opening (who owns what), the component that will own the new state, then commands.py for
the op and views.py for what it shows.  A new option is a line in options.py and one in
protocol/schema/task_info.py; a new limit lives in limiter.py (a group's, in
group_limits.py); a new status move is a row of MOVES and a call in the ledger.
"""
