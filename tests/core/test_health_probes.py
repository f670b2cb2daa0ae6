"""Who probes which server for the active health checks, in the broker core on a fake clock
(broker/core/tasks/components/health_probes.py, commands.py): each checked server goes to
one live dispatcher, pushed as R.T_CHECKS, and to another when that one leaves or stops;
only the assigned dispatcher's T_CHECKED moves a server's state, and a server failing its
checks is skipped by every dispatcher's calls until it passes again.  A dispatcher older
than HEALTH_CHECKS_SINCE is given none.  End to end: tests/end_to_end/test_health_checks_end_to_end.py."""
from __future__ import annotations

from test_tasks_core import D1, D2, HTTP, BrokerClock
from zstalk.broker.core.broker import Config
from zstalk.broker.core.tasks.store import FunctionSpec
from zstalk.broker.core.upstreams import ServerSpec, UpstreamSpec
from zstalk.broker.core.upstreams.health import HealthSpec
from zstalk.protocol.schema import Batch, Op, R, Replies
from zstalk.protocol.schema.messages import HEALTH_CHECKS_SINCE

A, B, C = "http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"
HEALTH = HealthSpec(path="/health", interval_s=2.0, fails=2, passes=1)


class Cluster(BrokerClock):
    """A broker whose function `gen` is on upstream `gpu` (servers A, B, C, checked)."""

    def __init__(self, health: HealthSpec = HEALTH, servers=(A, B, C)) -> None:
        upstream = UpstreamSpec("gpu", tuple(ServerSpec(u) for u in servers),
                                health_check=health)
        fn = FunctionSpec("gen", "", 100, upstream="gpu", path="/generate")
        super().__init__(config=Config(functions=(fn,), upstreams=(upstream,)))

    def checks(self, out: dict, peer: bytes) -> list[str] | None:
        """The servers the last R.T_CHECKS to `peer` lists (None: none sent)."""
        sent = [item[2] for item in out.get(peer, []) if item[1] == R.T_CHECKS]
        return [check[1] for check in sent[-1]] if sent else None

    def report(self, peer: bytes, url: str, ok: bool) -> None:
        self.send(peer, (Op.T_CHECKED, 1, "gpu", url, ok, None if ok else "answered 500"))

    def states(self) -> list[str]:
        view = self.broker.tasking.store.upstream.servers("gpu", self.now, 0.0)
        return [s.get("health", {}).get("status") for s in view]


def test_each_server_is_probed_by_one_dispatcher_and_servers_spread_over_dispatchers():
    c = Cluster()
    first = c.send(D1, (Op.T_SUBSCRIBE, 1, 4, False))
    assert c.checks(first, D1) == [A, B, C]
    assert first[D1][0][2][0] == ["gpu", A, "/health", 2000, 5000, [[200, 399]]]
    second = c.send(D2, (Op.T_SUBSCRIBE, 1, 4, False))
    assert c.checks(second, D1) == [A, B] and c.checks(second, D2) == [C]     # (its share)
    c.send(D1, (Op.CLOSE, 1))
    c.send(D1, (Op.OPEN, 1))
    again = c.send(D2, (Op.T_SUBSCRIBE, 1, 4, False))
    assert c.checks(again, D2) == [A, B, C]


def test_a_leaving_dispatchers_servers_go_to_another_and_with_none_nothing_probes():
    c = Cluster()
    c.send(D1, (Op.T_SUBSCRIBE, 1, 4, False))
    c.send(D2, (Op.T_SUBSCRIBE, 1, 4, False))
    out = c.send(D1, (Op.T_SUBSCRIBE, 1, 0, True))      # (stopping: it probes no more)
    assert c.checks(out, D1) == [] and c.checks(out, D2) == [A, B, C]
    c.send(D2, (Op.CLOSE, 1))
    assert c.broker.tasking.probes.holder == {}
    assert c.states() == ["up", "up", "up"]             # (no probes: state kept)


def test_only_the_assigned_dispatchers_reports_count_and_an_unhealthy_server_gets_no_calls():
    c = Cluster(servers=(A, B))
    c.send(D1, (Op.T_SUBSCRIBE, 1, 4, False))
    c.send(D2, (Op.T_SUBSCRIBE, 1, 4, False))
    for _ in range(3):
        c.report(D2, A, False)                          # (not D2's server: ignored)
    assert c.states() == ["up", "up"]
    c.report(D1, A, False)
    c.report(D1, A, False)
    assert c.states() == ["down", "up"]
    for n in range(4):
        out = c.send(HTTP, (Op.T_ENQUEUE, 1, "gen", b"{}", None, f"t{n}", True))
        calls = [item for items in out.values() for item in items if item[1] == R.T_CALL]
        assert calls and all(call[4].startswith(B) for call in calls)
    c.report(D1, A, True)
    assert c.states() == ["up", "up"]


def test_a_mandatory_check_keeps_servers_out_until_their_first_pass():
    c = Cluster(health=HEALTH._replace(mandatory=True), servers=(A, B))
    assert c.states() == ["down", "down"]
    c.send(D1, (Op.T_SUBSCRIBE, 1, 4, False))
    c.report(D1, B, True)
    assert c.states() == ["down", "up"]


def test_a_dispatcher_older_than_health_checks_is_given_no_probes():
    c = Cluster()
    c.broker.tasking.old_peers[D1] = HEALTH_CHECKS_SINCE - 1
    assert c.checks(c.send(D1, (Op.T_SUBSCRIBE, 1, 4, False)), D1) is None
    assert c.checks(c.send(D2, (Op.T_SUBSCRIBE, 1, 4, False)), D2) == [A, B, C]


def test_the_broker_exports_each_checked_servers_health_and_last_check():
    from zstalk.broker.metrics import BrokerMetrics
    c = Cluster(servers=(A, B))
    c.send(D1, (Op.T_SUBSCRIBE, 1, 4, False))
    c.report(D1, A, False)
    c.report(D1, A, False)
    samples = BrokerMetrics(c.broker).samples(c.now)
    up = {s.labels: s.value for s in samples if s.name == "zstalk_upstream_server_up"}
    last = {s.labels: s.value for s in samples
            if s.name == "zstalk_upstream_server_last_check_timestamp_seconds"}
    assert up == {("gpu", A): 0, ("gpu", B): 1}
    assert list(last) == [("gpu", A)] and last["gpu", A] == c.now + c.broker.wall_offset


def test_a_function_waiting_for_a_busy_upstream_runs_as_soon_as_a_server_is_healthy_again():
    c = Cluster(servers=(A, B))
    upstream = c.broker.tasking.store.upstream.groups["gpu"]
    upstream.peers[1].conn_cap = 1              # (B takes one call at a time)
    c.send(D1, (Op.T_SUBSCRIBE, 1, 4, False))
    c.report(D1, A, False)
    c.report(D1, A, False)
    c.send(HTTP, (Op.T_ENQUEUE, 1, "gen", b"{}", None, "t1", True))    # (on B: full now)
    held = c.send(HTTP, (Op.T_ENQUEUE, 1, "gen", b"{}", None, "t2", True))
    assert not [item for item in held.get(D1, []) if item[1] == R.T_CALL]
    c.broker.handle(D1, Batch([(Op.T_CHECKED, 1, "gpu", A, True, None)]), c.now)
    out = {p: m.items for p, m in c.broker.flush() if isinstance(m, Replies)}
    [call] = [item for item in out[D1] if item[1] == R.T_CALL]
    assert call[2] == "t2" and call[4].startswith(A)


def test_a_reload_sends_each_dispatcher_its_new_list_and_without_checks_an_empty_one():
    from zstalk.broker.config_file import TaskConfig
    c = Cluster()
    c.send(D1, (Op.T_SUBSCRIBE, 1, 4, False))
    fn = c.broker.tasking.store.functions["gen"]
    slower = UpstreamSpec("gpu", tuple(ServerSpec(u) for u in (A, B)),
                          health_check=HEALTH._replace(interval_s=10.0))
    c.broker.configure_functions(TaskConfig(named=(fn,), upstreams=(slower,)), c.now)
    out = {p: m.items for p, m in c.broker.flush() if isinstance(m, Replies)}
    assert [check[1:4] for check in out[D1][0][2]] == [[A, "/health", 10_000],
                                                       [B, "/health", 10_000]]
    c.broker.configure_functions(TaskConfig(named=(fn,), upstreams=(
        slower._replace(health_check=None),)), c.now)
    out = {p: m.items for p, m in c.broker.flush() if isinstance(m, Replies)}
    assert out[D1] == [(1, R.T_CHECKS, [])] and c.states() == [None, None]


def test_the_addresses_a_resolved_name_gains_are_probed_and_those_it_loses_are_not():
    upstream = UpstreamSpec("gpu", (ServerSpec("http://api.internal:8000", resolve=True),),
                            health_check=HEALTH)
    fn = FunctionSpec("gen", "", 100, upstream="gpu", path="/generate")
    c = BrokerClock(config=Config(functions=(fn,), upstreams=(upstream,)))
    first = c.send(D1, (Op.T_SUBSCRIBE, 1, 4, False))
    assert Cluster.checks(c, first, D1) == ["http://api.internal:8000"]
    for addresses, probed in ((("10.0.0.5", "10.0.0.6"),
                               ["http://10.0.0.5:8000", "http://10.0.0.6:8000"]),
                              (("10.0.0.6",), ["http://10.0.0.6:8000"])):
        assert c.broker.resolved("gpu", "http://api.internal:8000", addresses, c.now)
        out: dict = {}
        for peer, msg in c.broker.flush():
            if isinstance(msg, Replies):
                out.setdefault(peer, []).extend(msg.items)
        assert Cluster.checks(c, out, D1) == probed


def test_the_only_dispatcher_stopping_is_sent_an_empty_list_and_nobody_probes():
    c = Cluster()
    c.send(D1, (Op.T_SUBSCRIBE, 1, 4, False))
    out = c.send(D1, (Op.T_SUBSCRIBE, 1, 0, True))      # (stopping: the last prober)
    assert c.checks(out, D1) == [] and c.broker.tasking.probes.holder == {}
    c.send(D1, (Op.CLOSE, 1))
    assert c.states() == ["up", "up", "up"]
