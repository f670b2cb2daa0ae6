"""`zstalk top`'s board (broker/run/ops/top.py) without a terminal or a server: samples taken
on a fake clock become rates, keys sort and filter, and the screen is laid out as text."""
from __future__ import annotations

from zstalk.broker.run.ops.top import Board, Sample, fair_shares


def tube(name: str, ready: int = 0, total: int = 0, activity: int = 0, **more) -> dict:
    return {"name": name, "currentJobsReady": ready, "currentJobsReserved": 0,
            "currentJobsDelayed": 0, "currentJobsBuried": 0, "totalJobs": total,
            "activity": activity, "paused": False, **more}


def names(board: Board) -> list[str]:
    return [row["name"] for row in board.rows(board.sample.tubes, {})] if board.sort in (
        "activity", "name") else [row["name"] for row in board.rows(
            board.sample.tubes, {"ready": "currentJobsReady"})]


def test_rates_are_the_per_second_differences_of_two_samples():
    board = Board("here")
    board.take(Sample([tube("a", total=10, activity=10)]), now=100.0)
    board.take(Sample([tube("a", total=14, activity=20)]), now=102.0)
    [a] = board.sample.tubes
    assert (a["putRate"], a["eventRate"]) == (2.0, 5.0)


def test_a_beanstalk_tube_without_activity_counts_puts_and_deletes():
    board = Board("here")
    board.take(Sample([{"name": "a", "totalJobs": 3, "cmdDelete": 1}]), now=0.0)
    board.take(Sample([{"name": "a", "totalJobs": 5, "cmdDelete": 2}]), now=1.0)
    assert board.sample.tubes[0]["eventRate"] == 3.0


def test_activity_puts_what_moves_now_before_what_moved_long_ago():
    board = Board("here")
    board.take(Sample([tube("old", activity=1000), tube("new", activity=1)]), now=0.0)
    board.take(Sample([tube("old", activity=1000), tube("new", activity=5)]), now=1.0)
    assert names(board) == ["new", "old"]


def test_s_cycles_the_sort_and_slash_filters_by_name():
    board = Board("here")
    board.take(Sample([tube("emails", ready=1), tube("images", ready=9)]), now=0.0)
    assert board.press("s") and board.sort == "name"
    assert names(board) == ["emails", "images"]
    board.press("s")
    assert board.sort == "ready" and names(board) == ["images", "emails"]
    for key in "/em\n":
        board.press(key)
    assert board.filter == "em" and names(board) == ["emails"]
    board.press("\x1b")
    assert board.filter == "" and len(names(board)) == 2


def test_typing_a_filter_shows_in_the_title_and_backspace_takes_a_letter_back():
    board = Board("here")
    for key in "/ab\x7fc":
        board.press(key)
    assert "filter: /ac_" in board.lines(120, 10)[0] and board.filter == ""
    assert board.press("q") and board.typing == "acq"       # (a q typed is a letter)


def test_q_quits():
    assert Board("here").press("q") is False


def test_the_screen_fits_its_size_and_shares_rows_between_the_tables():
    board = Board("http://x")
    board.take(Sample([tube(f"t{i:02}") for i in range(50)],
                      [{"name": "fn", "queued": 3, "running": 1, "startRate": 0.5}],
                      [{"name": "gpu", "current": 1, "max": 4}]), now=0.0)
    screen = board.lines(80, 20)
    assert len(screen) == 20 and all(len(text) <= 80 for text in screen)
    assert screen[1].split()[:2] == ["TUBE", "READY"]
    assert any(text.split()[:3] == ["fn", "3", "1"] for text in screen)
    assert any(text.split() == ["gpu", "1", "4"] for text in screen)
    assert screen[-1].startswith("tubes: 50  functions: 1  counters: 1")


def test_the_peers_show_a_pools_credits_and_a_dispatchers_slots_and_the_filter_takes_them_too():
    board = Board("http://x")
    peers = [{"name": "dispatcher 7", "kind": "dispatcher", "pid": 7, "sessions": 1, "slots": 64,
              "stopping": False, "lastSeenMs": 300},
             {"name": "pool 9", "kind": "pool", "pid": 9, "sessions": 1, "credits": 2,
              "reserved": 1, "tubes": ["emails"], "lastSeenMs": 120}]
    board.take(Sample([tube("emails")], None, None, peers), now=0.0)
    screen = board.lines(100, 20)
    assert ["PEER", "SESSIONS", "CREDITS", "SLOTS", "RESERVED", "SEEN", "MS"] in [
        text.split() for text in screen]
    assert ["dispatcher", "7", "1", "-", "64", "-", "300"] in [text.split() for text in screen]
    assert ["pool", "9", "1", "2", "-", "1", "120"] in [text.split() for text in screen]
    assert screen[-1] == "tubes: 1  peers: 2"
    board.press("/"), board.press("p"), board.press("o"), board.press("\n")
    assert board.lines(100, 20)[-1] == "tubes: 0  peers: 1"


def test_a_failed_sample_is_said_on_the_status_line_and_the_last_numbers_stay():
    board = Board("here")
    board.take(Sample([tube("a", ready=2)]), now=0.0)
    board.failed("cannot reach the HTTP API at 127.0.0.1:1")
    screen = board.lines(120, 10)
    assert screen[-1].endswith("cannot reach the HTTP API at 127.0.0.1:1")
    assert screen[2].split()[:2] == ["a", "2"]


def test_fair_shares_give_what_one_table_does_not_need_to_the_others():
    assert fair_shares(10, [2, 50, 50]) == [2, 4, 4]
    assert fair_shares(10, [1, 1]) == [1, 1]
    assert fair_shares(0, [3]) == [0]
