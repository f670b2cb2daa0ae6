"""A function's due tasks when they have groups (tenants): the order the rotation hands
them out in, and each task's place in it (issue 44).

The order: levels first, across all groups.  Within a level, the groups with a due task
are served in turn, one task per turn, each group its best by (priority, seq); the turn
goes round the groups in the order they joined, and a group whose first task becomes due
(a new group, or one whose line had run out) joins at the end of that order: it has its
first turn at the end of the round going on.  A task that leaves without its turn (a
cancel, a queue timeout) costs its group nothing: the group keeps its place.  Nothing of
this is durable: after a restart the tasks come back in enqueue order, so the groups join
oldest first.

How, per level: picture the hand-outs as a grid, a row per round and a column per group,
the columns left to right in the order the groups joined (`col`, a counter).  A group's
tasks, best first, fill its column from the row of its next turn (`row`) down, so the
task with r tasks of its group before it sits at (row + r, col), and the rotation hands
the cells out row by row, left to right.  `cells` holds one (row, col) per due task, in a
SortedList: the head is its first cell's group's best task, and a task's waitNum (the due
tasks handed out before it if every group could start now) is the number of cells before
its own, plus the due tasks of higher levels: a bisect, O(log n).  A cell is no task's:
a column is exactly as long as its group's line, so every change moves one cell:

    a task joins a group       its column gains a cell at the bottom
    the group has its turn     its top cell goes (row + 1: its next task is on top)
    a task leaves, no turn     its bottom cell goes, and the group keeps its turn

A new group's column goes right of all the others (the next col), from the row being
served (the first cell's), so its turn comes at the end of this round.  A function whose
tasks have no group (all in the group "") keeps the plain line lines.py gives it, whose
order is this one's with a single group, at a bisect less per change.
"""
from __future__ import annotations

from typing import Iterable

from sortedcontainers import SortedList


class _Column:
    __slots__ = ("row", "col", "keys")

    def __init__(self, row: int, col: int) -> None:
        self.row, self.col = row, col       # the cell of its next turn
        self.keys = SortedList()            # its due tasks' keys, best first


class _Level:
    """One level's groups, their columns and the cells of the grid."""
    __slots__ = ("cells", "groups", "names", "next_col")

    def __init__(self) -> None:
        self.cells = SortedList()                   # (row, col) per due task
        self.groups: dict[str, _Column] = {}
        self.names: dict[int, str] = {}             # col -> its group
        self.next_col = 0

    def join(self, group: str) -> _Column:
        """`group` has its first due task here: a column right of all, from the row being
        served."""
        column = self.groups[group] = _Column(self.cells[0][0] if self.cells else 0,
                                              self.next_col)
        self.names[self.next_col] = group
        self.next_col += 1
        return column

    def leave(self, group: str, column: _Column) -> None:
        del self.groups[group], self.names[column.col]


class Rotation:
    """The due tasks of one function with groups, by key (task.py: (-level, priority,
    seq)) and group; the methods lines.py uses of a plain line (SortedList) are here too:
    `[0]` (the head), `len`, `add`, `remove`."""
    __slots__ = ("levels", "count", "head")

    def __init__(self, keys: Iterable[tuple] = ()) -> None:
        self.levels: dict[int, _Level] = {}         # -level -> its grid
        self.count = 0
        self.head: tuple | None = None              # the key handed out next
        for key in keys:                            # (a plain line's: the group "")
            self.add(key, "")

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple:
        if index != 0 or self.head is None:
            raise IndexError("a rotation shows its head only")
        return self.head

    def add(self, key: tuple, group: str) -> None:
        level = self.levels.get(key[0])
        if level is None:
            level = self.levels[key[0]] = _Level()
        column = level.groups.get(group)
        if column is None:
            column = level.join(group)
        level.cells.add((column.row + len(column.keys), column.col))
        column.keys.add(key)
        self.count += 1
        self._set_head()

    def remove(self, key: tuple, group: str, turn: bool = False) -> None:
        """`key` leaves: handed out (`turn`: it is the head, and its group has had its
        turn), or without a turn (its group keeps its place)."""
        level = self.levels[key[0]]
        column = level.groups[group]
        if turn and key == self.head:
            level.cells.remove((column.row, column.col))
            column.row += 1
        else:
            level.cells.remove((column.row + len(column.keys) - 1, column.col))
        column.keys.remove(key)
        if not column.keys:
            level.leave(group, column)
            if not level.groups:
                del self.levels[key[0]]
        self.count -= 1
        self._set_head()

    def _set_head(self) -> None:
        if not self.levels:
            self.head = None
            return
        level = self.levels[min(self.levels)]
        col = level.cells[0][1]
        self.head = level.groups[level.names[col]].keys[0]

    def rank(self, key: tuple, group: str) -> int:
        """The due tasks handed out before the task of `key` in `group` if every group
        could start now (one not due yet: as if it were due now)."""
        ahead = sum(len(level.cells) for lv, level in self.levels.items() if lv < key[0])
        level = self.levels.get(key[0])
        if level is None:
            return ahead
        column = level.groups.get(group)
        if column is None:                          # it would join: right of all
            return ahead + level.cells.bisect_left((level.cells[0][0], level.next_col))
        cell = (column.row + column.keys.bisect_left(key), column.col)
        return ahead + level.cells.bisect_left(cell)

    def groups(self) -> dict[str, int]:
        """Each group's due tasks (every level)."""
        out: dict[str, int] = {}
        for level in self.levels.values():
            for group, column in level.groups.items():
                out[group] = out.get(group, 0) + len(column.keys)
        return out
