"""A function's due tasks when they have groups (tenants): the order the rotation hands
them out in, and each task's place in it (issue 44).

The order: levels first, across all groups.  Within a level, the groups with a due task
are served in turn, one task per turn, each group its best by (priority, seq); the turn
goes round the groups in the order they joined, and a group whose first task becomes due
(a new group, or one whose line had run out) joins at the end of that order: it has its
first turn at the end of the round going on.  A task that leaves without its turn (a
cancel, a queue timeout) costs its group nothing: the group keeps its place.  A group its
own limits hold back (group_limits.py: its group_concurrency, its group_rate's gate) is
passed over and keeps its place too: the turn goes on to the next group, and the group
held back has its next turn when the turn comes round to it again, at most one round
later; it never gets several turns in a row for those it missed.  Nothing of this is
durable: after a restart the tasks come back in enqueue order, so the groups join oldest
first.

How, per level: picture the hand-outs as a grid, a row per round and a column per group,
the columns left to right in the order the groups joined (`col`, a counter).  Rows are
counted from each group's next turn: a group's tasks, best first, are its column's cells
at depth 0, 1, 2, ...  The round going on starts at the cursor `at`: the groups from
column `at` on have their next turn in it, those left of it in the next round.  So the
hand-out order is by (depth, the column turned round to start at `at`), and a task's
waitNum (the due tasks handed out before it if every group could start now) is the
number of cells before its own in that order, plus the due tasks of higher levels:

    the cells of a lower depth          + the cells of its depth in the columns
    cells.bisect_left((depth, -1))        from `at` round to its own (two bisects)

`cells` holds one (depth, col) per due task, in a SortedList: O(log n) per place.  A
column is exactly as long as its group's line, so every change moves one cell:

    a task joins a group       its column gains a cell at the bottom
    the group has its turn     its bottom cell goes (its next task is at depth 0), and
                               the cursor moves just right of its column
    a task leaves, no turn     its bottom cell goes, and the cursor stays

A group passed over costs nothing: rows are counted from each group's next turn, so
the cursor moving past its column puts it in the next round.  The head is the first
column from `at` round whose group may start (`open`, the columns of those groups, a
bisect); the group limits say when a group is held back or free again (`hold`, `free`),
and who is held back when a group joins a level (`held`, a function of the group).  A
cursor right of every column goes round to 0 at once, as a turn does after the last
group (a group joining then is last in the next round, not first).  A function whose
tasks have no group (all in the group "") and no group limits keeps the plain line
lines.py gives it, whose order is this one's with a single group, at a bisect less per
change.
"""
from __future__ import annotations

from typing import Callable, Iterable

from sortedcontainers import SortedList


def _never(group: str) -> bool:
    return False


class _Column:
    __slots__ = ("col", "keys")

    def __init__(self, col: int) -> None:
        self.col = col
        self.keys = SortedList()            # its due tasks' keys, best first


class _Level:
    """One level's groups, their columns, the cells of the grid and the cursor."""
    __slots__ = ("cells", "groups", "names", "open", "at", "next_col")

    def __init__(self) -> None:
        self.cells = SortedList()                   # (depth, col) per due task
        self.groups: dict[str, _Column] = {}
        self.names: dict[int, str] = {}             # col -> its group
        self.open = SortedList()                    # cols of the groups that may start
        self.at = 0                                 # the round going on starts here
        self.next_col = 0

    def join(self, group: str, held: bool) -> _Column:
        """`group` has its first due task here: a column right of all (the end of the
        round going on)."""
        column = self.groups[group] = _Column(self.next_col)
        self.names[self.next_col] = group
        if not held:
            self.open.add(self.next_col)
        self.next_col += 1
        return column

    def leave(self, group: str, column: _Column) -> None:
        del self.groups[group], self.names[column.col]
        self.open.discard(column.col)
        self.turn_round()

    def turn_round(self) -> None:
        """A cursor right of every column goes round to the first."""
        if self.cells.bisect_left((0, self.at)) == len(self.groups):
            self.at = 0

    def first_open(self) -> int | None:
        """The column of the next turn among the groups that may start (None: none)."""
        open_ = self.open
        if not open_:
            return None
        i = open_.bisect_left(self.at)
        return open_[i] if i < len(open_) else open_[0]

    def rank(self, depth: int, col: int) -> int:
        """The cells handed out before cell (depth, col), every group starting now."""
        cells, at = self.cells, self.at
        before = cells.bisect_left((depth, -1))
        if col >= at:
            return before + cells.bisect_left((depth, col)) - cells.bisect_left((depth, at))
        return (cells.bisect_left((depth + 1, -1)) - cells.bisect_left((depth, at))
                + cells.bisect_left((depth, col)))


class Rotation:
    """The due tasks of one function with groups, by key (task.py: (-level, priority,
    seq)) and group; the methods lines.py uses of a plain line (SortedList) are here too:
    `[0]` (the head), `len`, `add`, `remove`.  `held(group)`: whether the group limits
    hold that group back now (asked when it joins a level)."""
    __slots__ = ("levels", "count", "head", "held")

    def __init__(self, keys: Iterable[tuple] = (),
                 held: Callable[[str], bool] = _never) -> None:
        self.levels: dict[int, _Level] = {}         # -level -> its grid
        self.count = 0
        self.head: tuple | None = None              # the key handed out next (None: no
        self.held = held                            # group may start)
        for key in keys:                            # (a plain line's: the group "")
            self.add(key, "")

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple | None:
        """`[0]`: the head (None: every group is held back), as a plain line's first."""
        if index != 0:
            raise IndexError("a rotation shows its head only")
        return self.head

    def add(self, key: tuple, group: str) -> None:
        level = self.levels.get(key[0])
        if level is None:
            level = self.levels[key[0]] = _Level()
        column = level.groups.get(group)
        if column is None:
            column = level.join(group, self.held(group))
        level.cells.add((len(column.keys), column.col))
        column.keys.add(key)
        self.count += 1
        self._set_head()

    def remove(self, key: tuple, group: str, turn: bool = False) -> None:
        """`key` leaves: handed out (`turn`: it is the head, and its group has had its
        turn), or without a turn (its group keeps its place)."""
        level = self.levels[key[0]]
        column = level.groups[group]
        level.cells.remove((len(column.keys) - 1, column.col))
        if turn and key == self.head:
            level.at = column.col + 1
        column.keys.remove(key)
        if not column.keys:
            level.leave(group, column)
            if not level.groups:
                del self.levels[key[0]]
        elif turn:
            level.turn_round()
        self.count -= 1
        self._set_head()

    # -- groups held back by their limits ----------------------------------------------------
    def hold(self, group: str) -> None:
        """`group` may not start now: passed over, in its place, until `free`."""
        for level in self.levels.values():
            column = level.groups.get(group)
            if column is not None:
                level.open.discard(column.col)
        self._set_head()

    def free(self, group: str) -> None:
        """`group` may start again: served when the turn comes to its place."""
        for level in self.levels.values():
            column = level.groups.get(group)
            if column is not None and column.col not in level.open:
                level.open.add(column.col)
        self._set_head()

    def _set_head(self) -> None:
        """The head: the next turn of the highest level with a group that may start (the
        levels below are looked at only when every group of those above is held back)."""
        levels = self.levels
        self.head = None
        if not levels:
            return
        top = min(levels)
        for lv in (top,) if levels[top].open else sorted(levels):
            level = levels[lv]
            col = level.first_open()
            if col is not None:
                self.head = level.groups[level.names[col]].keys[0]
                return

    # -- looking -------------------------------------------------------------------------------
    def rank(self, key: tuple, group: str) -> int:
        """The due tasks handed out before the task of `key` in `group` if every group
        could start now (one not due yet: as if it were due now)."""
        ahead = sum(len(level.cells) for lv, level in self.levels.items() if lv < key[0])
        level = self.levels.get(key[0])
        if level is None:
            return ahead
        column = level.groups.get(group)
        if column is None:                          # it would join: right of all
            return ahead + level.rank(0, level.next_col)
        return ahead + level.rank(column.keys.bisect_left(key), column.col)

    def groups(self) -> dict[str, int]:
        """Each group's due tasks (every level)."""
        out: dict[str, int] = {}
        for level in self.levels.values():
            for group, column in level.groups.items():
                out[group] = out.get(group, 0) + len(column.keys)
        return out
