"""An operator's page of functions (V_FUNCTIONS: broker/core/tasks/commands.py) on the
pure core with a fake clock: searched by a part of the name across all the functions, by
name or busiest first (starts a second, then tasks queued and running), the ranking sorted
again at most once a second and walked a page at a time."""
from __future__ import annotations

from zstalk.broker.core.broker import Broker, Config
from zstalk.broker.core.shared.ranking import RANK_S
from zstalk.broker.core.tasks.store import FunctionSpec
from zstalk.protocol.schema import Batch, Hello, Op, R, Replies

HTTP, DISPATCHER = b"http-front", b"dispatcher"
NAMES = ("a-mail", "b-mail", "sms", "thumbs")


class Node:
    def __init__(self) -> None:
        self.now, self.n = 1000.0, 0
        self.broker = Broker(Config(functions=tuple(
            FunctionSpec(name, f"http://fn/{name}", 1) for name in NAMES)), self.now)
        for peer, kind in ((HTTP, "http"), (DISPATCHER, "dispatcher")):
            self.broker.handle(peer, Hello(hash(peer) & 0xFFFF, kind, 1, 0, []), self.now)
            self.send(peer, (Op.OPEN, 1))

    def send(self, peer: bytes, *ops) -> list[tuple]:
        self.broker.handle(peer, Batch([tuple(op) for op in ops]), self.now)
        return [item for p, msg in self.broker.flush() if p == peer and isinstance(msg, Replies)
                for item in msg.items]

    def enqueue(self, function: str, count: int) -> None:
        for _ in range(count):
            self.n += 1
            self.send(HTTP, (Op.T_ENQUEUE, 1, function, b"{}", None, f"t{self.n}", True, None))

    def page(self, q: str, sort: str, after: str = "", limit: int = 10) -> tuple:
        [reply] = self.send(HTTP, (Op.V_FUNCTIONS, 1, q, sort, after, limit))
        return (reply[1], [f["name"] for f in reply[2]], reply[3]) if reply[1] == R.V_PAGE \
            else reply[1:]


def test_functions_are_searched_across_all_of_them_by_name_and_paged():
    node = Node()
    assert node.page("mail", "name", limit=1) == (R.V_PAGE, ["a-mail"], "a-mail")
    assert node.page("mail", "name", "a-mail", 1) == (R.V_PAGE, ["b-mail"], None)
    assert node.page("", "name")[1] == list(NAMES)
    assert node.page("nothing", "name") == (R.V_PAGE, [], None)


def test_the_busiest_come_first_starts_a_second_before_tasks_waiting():
    node = Node()
    node.enqueue("sms", 3)
    node.enqueue("b-mail", 1)
    assert node.page("", "activity")[1] == ["sms", "b-mail", "a-mail", "thumbs"]
    node.now += RANK_S
    node.send(DISPATCHER, (Op.T_SUBSCRIBE, 1, 8, False))    # (each starts one call)
    node.enqueue("thumbs", 1)
    node.now += RANK_S
    code, names, more = node.page("", "activity")
    # sms, b-mail and thumbs each started a call (concurrency 1): sms has 2 more waiting
    assert names[:3] == ["sms", "b-mail", "thumbs"] and names[3] == "a-mail"
    [reply] = node.send(HTTP, (Op.V_FUNCTIONS, 1, "", "activity", "", 10))
    assert reply[2][0]["name"] == "sms" and reply[2][0]["running"] == 1


def test_the_ranking_is_sorted_again_at_most_once_a_second_and_walked_a_page_at_a_time():
    node = Node()
    node.enqueue("thumbs", 1)
    assert node.page("", "activity")[1][0] == "thumbs"
    node.enqueue("sms", 5)
    assert node.page("", "activity")[1][0] == "thumbs", "sorted a moment ago"
    node.now += RANK_S
    assert node.page("", "activity", limit=1) == (R.V_PAGE, ["sms"], "sms")
    assert node.page("", "activity", "sms", 1) == (R.V_PAGE, ["thumbs"], "thumbs")
    assert node.page("s", "activity", "sms", 2) == (R.V_PAGE, ["thumbs"], None)


def test_a_bad_sort_or_limit_is_a_bad_request():
    node = Node()
    assert node.page("", "size")[:1] == (R.T_ERROR,)
    assert node.page("", "name", limit=0)[:2] == (R.T_ERROR, "bad_request")
