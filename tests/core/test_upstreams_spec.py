"""An upstream spec is refused as nginx refuses its `upstream` block, each refusal naming
the key (ngx_http_upstream.c: ngx_http_upstream_server; the balancers' directive flags)."""
from __future__ import annotations

import pytest

from zstalk.broker.core.upstreams.spec import ServerSpec, SpecError, UpstreamSpec, url_error, validate


def upstream(*servers: ServerSpec, **options) -> UpstreamSpec:
    return UpstreamSpec("gpu", servers or (ServerSpec("http://10.0.0.1:8000"),), **options)


def keys(spec: UpstreamSpec) -> list[str]:
    return [error.key for error in validate(spec)]


def test_a_server_has_nginx_defaults():
    server = ServerSpec("http://10.0.0.1:8000")
    assert (server.weight, server.max_fails, server.fail_timeout_s, server.max_conns) == (1, 1, 10, 0)
    assert not server.backup and not server.down


@pytest.mark.parametrize("url, server", [
    ("http://10.0.0.1:8000", "10.0.0.1:8000"),
    ("https://gpu.example", "gpu.example"),
    ("http://[::1]:80", "[::1]:80"),
    ("http://Host:080", "Host:080"),        # as written: no case folding, no port normalising
])
def test_the_server_string_is_host_and_port_exactly_as_written(url, server):
    assert url_error(url) is None
    assert ServerSpec(url).server == server


@pytest.mark.parametrize("url", [
    "10.0.0.1:8000", "ftp://a", "http://", "http://a/", "http://a:8000/x", "http://a?b",
    "http://u@a", "http://a:0", "http://a:65536", "http://a:", "http://a b", 8000,
])
def test_a_url_is_scheme_host_and_port_with_no_path(url):
    assert url_error(url) is not None


def test_a_valid_spec_has_no_errors():
    spec = upstream(ServerSpec("http://a:1", weight=5), ServerSpec("http://b:1", max_fails=0),
                    ServerSpec("http://c:1", backup=True), ServerSpec("http://d:1", down=True))
    assert validate(spec) == []


@pytest.mark.parametrize("field, value", [
    ("weight", 0), ("weight", -1), ("weight", 1.5), ("weight", True),
    ("max_fails", -1), ("max_conns", -1), ("max_conns", "2"),
    ("fail_timeout_s", -1), ("fail_timeout_s", float("nan")), ("fail_timeout_s", "10s"),
    ("backup", 1), ("down", "yes"),
])
def test_a_bad_server_parameter_names_its_key(field, value):
    spec = upstream(ServerSpec("http://a:1"), ServerSpec("http://b:1", **{field: value}))
    key = field.removesuffix("_s")
    assert keys(spec) == [f"servers[1].{key}"]


@pytest.mark.parametrize("balance", ["ip_hash", "hash", "random"])
def test_backup_is_only_for_round_robin_and_least_conn(balance):
    options = {"key": "uniqueId"} if balance == "hash" else {}
    spec = upstream(ServerSpec("http://a:1"), ServerSpec("http://b:1", backup=True),
                    balance=balance, **options)
    [error] = validate(spec)
    assert error.key == "servers[1].backup" and balance in error.message
    for allowed in ("round_robin", "least_conn"):
        assert validate(upstream(*spec.servers, balance=allowed)) == []


def test_an_upstream_needs_a_server_that_is_not_a_backup():
    assert keys(upstream(ServerSpec("http://a:1", backup=True))) == ["servers"]
    assert keys(UpstreamSpec("gpu", ())) == ["servers"]


def test_the_key_consistent_and_two_belong_to_their_methods():
    assert keys(upstream(balance="hash")) == ["key"]
    assert keys(upstream(balance="hash", key="")) == ["key"]
    assert keys(upstream(key="params.user")) == ["key"]
    assert keys(upstream(consistent=True)) == ["consistent"]
    assert keys(upstream(balance="random", consistent=True)) == ["consistent"]
    assert keys(upstream(two=True)) == ["two"]
    assert validate(upstream(balance="hash", key="params.user", consistent=True)) == []
    assert validate(upstream(balance="random", two=True)) == []


def test_an_unknown_balance_is_refused_with_the_known_ones():
    [error] = validate(upstream(balance="least_time"))
    assert error == SpecError("balance", error.message) and "least_conn" in error.message


def test_a_url_may_appear_once_per_upstream():
    spec = upstream(ServerSpec("http://a:1"), ServerSpec("http://b:1"), ServerSpec("http://a:1"))
    [error] = validate(spec)
    assert error.key == "servers[2].url" and "servers[0]" in error.message
    # the same host:port under another scheme is another server (it shares its hash points)
    assert validate(upstream(ServerSpec("http://a:1"), ServerSpec("https://a:1"))) == []


def test_every_error_is_reported_at_once_and_reads_as_key_then_reason():
    spec = upstream(ServerSpec("http://a:1", weight=0), ServerSpec("b", max_fails=-1),
                    balance="hash")
    assert keys(spec) == ["key", "servers[0].weight", "servers[1].url", "servers[1].max_fails"]
    assert str(validate(spec)[1]) == "servers[0].weight: must be an integer of at least 1"


def test_keep_alive_has_nginxs_defaults_and_refuses_what_nginx_would():
    spec = upstream()
    assert (spec.keepalive, spec.keepalive_timeout_s, spec.keepalive_requests) == (32, 60, 1000)
    assert keys(upstream(keepalive=0)) == []        # (a connection per call)
    assert keys(upstream(keepalive=-1, keepalive_timeout_s=0, keepalive_requests=0)) == [
        "keepalive", "keepalive_requests", "keepalive_timeout"]


def test_the_config_file_names_the_file_and_the_keep_alive_key(tmp_path):
    from zstalk.broker.config_file import ConfigError, load
    path = tmp_path / "zstalk.toml"
    path.write_text('[upstreams.gpu]\nkeepalive = 4\nkeepalive_timeout = "5s"\n'
                    'keepalive_requests = 10\nservers = [{ url = "http://a:1" }]\n')
    spec = load(str(path)).upstreams[0]
    assert (spec.keepalive, spec.keepalive_timeout_s, spec.keepalive_requests) == (4, 5.0, 10)
    path.write_text('[upstreams.gpu]\nkeepalive_requests = 0\nservers = [{ url = "http://a:1" }]\n')
    with pytest.raises(ConfigError, match=r"zstalk.toml: \[upstreams.gpu\] keepalive_requests"):
        load(str(path))
