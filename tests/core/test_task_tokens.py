"""A task's own token in the broker core, on a fake clock (issue 45): the front sends the
SHA-256 of the token it made with the enqueue (T_ENQUEUE's ext), and T_INFO / T_CANCEL
with a token's digest read, cancel or leave that task only; another task's, a wrong one,
or any for a task that has none is refused `forbidden`.  The 201 is made after the turn's
hand-out.  The HTTP side end to end: tests/end_to_end/test_task_tokens_end_to_end.py."""
from __future__ import annotations

import hashlib

from test_tasks_core import BrokerClock, HTTP
from zstalk.broker.core.tasks.store import ApiPolicy
from zstalk.protocol.schema import Op, R
from zstalk.protocol.schema.tokens import TOKEN_CHARS, digest, make_tokens, matches

TOKENS = make_tokens(3)


def sha(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class Room(BrokerClock):
    """A broker whose function "f" is a room of one slot (online tasks, public)."""

    def __init__(self, **spec) -> None:
        super().__init__(**{"online": "public", "concurrency": 1, "pass_ttl_ms": 60_000,
                            "admit_url": "https://shop.example/in", **spec})

    def join(self, uid: str, token: str | None, online: bool = True) -> tuple:
        ext = {"type": "online"} if online else {}
        if token is not None:
            ext["token_sha256"] = sha(token)
        [reply] = self.send(HTTP, (Op.T_ENQUEUE, 1, "f", b"{}", None, uid, True,
                                   ext or None))[HTTP]
        return reply

    def read(self, uid: str, token: str | None, keyed: bool = False) -> tuple:
        op = (Op.T_INFO, 1, uid, keyed) if token is None else (Op.T_INFO, 1, uid, keyed,
                                                                sha(token))
        [reply] = self.send(HTTP, op)[HTTP]
        return reply

    def leave(self, uid: str, token: str | None) -> tuple:
        op = (Op.T_CANCEL, 1, uid) if token is None else (Op.T_CANCEL, 1, uid, sha(token))
        [reply] = self.send(HTTP, op)[HTTP]
        return reply


def test_a_token_is_zt1_and_43_characters_of_base64url_and_the_broker_keeps_its_sha256():
    assert all(len(t) == TOKEN_CHARS == 47 and t.startswith("zt1_") for t in TOKENS)
    assert len(set(TOKENS)) == 3 and all("=" not in t for t in TOKENS)
    assert digest(TOKENS[0]) == sha(TOKENS[0])
    assert matches(sha(TOKENS[0]), sha(TOKENS[0])) and not matches(None, sha(TOKENS[0]))
    room = Room()
    room.join("t1", TOKENS[0])
    assert room.broker.tasking.store.tasks["t1"].token == sha(TOKENS[0])


def test_a_token_reads_its_own_task_and_another_tasks_token_or_a_wrong_one_is_forbidden():
    room = Room()
    room.join("t1", TOKENS[0])
    room.join("t2", TOKENS[1])
    assert room.read("t2", TOKENS[1])[1:3] == (R.T_TASK, room.read("t2", None)[2])
    for token in (TOKENS[0], "zt1_" + "A" * 43):
        assert room.read("t2", token)[1:3] == (R.T_ERROR, "forbidden")
    assert room.read("nosuch", TOKENS[0])[1:3] == (R.T_ERROR, "not_found")


def test_a_token_reads_its_task_where_private_results_needs_the_key_for_others():
    room = Room(api=ApiPolicy(private_results=True))
    room.join("t1", TOKENS[0])
    assert room.read("t1", None)[1:3] == (R.T_ERROR, "unauthorized")
    assert room.read("t1", TOKENS[0])[1] == R.T_TASK
    assert "clientIp" not in room.read("t1", TOKENS[0])[2], "the token is not the master key"


def test_a_task_without_a_token_refuses_every_token_and_the_key_still_does_everything():
    room = Room()
    room.join("t1", None)
    room.join("t2", None)
    assert room.read("t2", TOKENS[0])[1:3] == (R.T_ERROR, "forbidden")
    assert room.leave("t2", TOKENS[0])[1:3] == (R.T_ERROR, "forbidden")
    assert room.read("t2", None, keyed=True)[2]["status"] == "queued"
    assert room.leave("t2", None)[2]["status"] == "cancelled", "the key (the front checked it)"


def test_a_malformed_digest_is_refused_like_a_wrong_token():
    room = Room()
    room.join("t1", TOKENS[0])
    [reply] = room.send(HTTP, (Op.T_INFO, 1, "t1", False, b"short"))[HTTP]
    assert reply[1:3] == (R.T_ERROR, "forbidden")
    [reply] = room.send(HTTP, (Op.T_CANCEL, 1, "t1", "not bytes"))[HTTP]
    assert reply[1:3] == (R.T_ERROR, "forbidden")
    assert room.read("t1", None)[2]["status"] == "admitted", "nothing changed"


def test_a_visitor_who_leaves_with_its_token_frees_its_place_at_once_and_those_behind_move_up():
    room = Room()
    for n in range(4):
        room.join(f"t{n + 1}", TOKENS[n % 3])
    assert [room.read(f"t{n}", None)[2].get("waitNum") for n in (1, 2, 3, 4)] == [None, 0, 1, 2]
    assert room.leave("t2", TOKENS[0])[1:3] == (R.T_ERROR, "forbidden"), "t4's is not t2's"
    left = room.leave("t2", TOKENS[1])
    assert left[1] == R.T_TASK and left[2]["status"] == "cancelled"
    assert [room.read(f"t{n}", None)[2].get("waitNum") for n in (3, 4)] == [0, 1], "at once"
    assert room.broker.tasking.store.room.counts["f"] == [2, 1], "two wait, one admitted"


def test_an_admitted_visitor_who_leaves_with_its_token_gives_its_slot_to_the_next():
    room = Room()
    room.join("t1", TOKENS[0])
    room.join("t2", TOKENS[1])
    assert room.leave("t1", TOKENS[0])[2]["status"] == "cancelled"
    assert room.read("t2", TOKENS[1])[2]["status"] == "admitted"


def test_an_online_task_admitted_in_its_enqueues_turn_answers_admitted_with_its_pass_fields():
    room = Room()
    first, second = room.join("t1", TOKENS[0]), room.join("t2", TOKENS[1])
    assert first[2] == {"uniqueId": "t1", "status": "admitted", "createdAt": room.now,
                        "passExpiresAt": room.now + 60, "admitUrl": "https://shop.example/in"}
    assert first[2]["passExpiresAt"] == room.read("t1", None)[2]["passExpiresAt"], "as a GET"
    assert second[2] == {"uniqueId": "t2", "status": "queued", "createdAt": room.now,
                         "waitNum": 0}


def test_an_offline_task_taken_in_its_enqueues_turn_answers_running():
    room = Room()
    room.send(b"disp-1", (Op.T_SUBSCRIBE, 1, 1, False))
    reply = room.join("t1", TOKENS[0], online=False)
    assert reply[2] == {"uniqueId": "t1", "status": "running", "createdAt": room.now}
