"""The TOML config file: functions, their defaults, durations with units, and errors that
name the file and the key."""
from __future__ import annotations

import pytest

from zstalk.broker.config_file import ConfigError, check_passes, duration_ms, load
from zstalk.broker.core.tasks.store import ApiPolicy, FunctionSpec


def write(tmp_path, text: str) -> str:
    path = tmp_path / "zstalk.toml"
    path.write_text(text)
    return str(path)


def test_named_functions_take_the_defaults_they_do_not_set(tmp_path):
    got = load(write(tmp_path, """
[functions]
concurrency = 3
timeout = "20s"

[functions.closeOrder]
url = "http://orders:3000/closeOrder"
timeout = "500ms"
"""))
    assert got.named == (FunctionSpec("closeOrder", "http://orders:3000/closeOrder", 3, 500,
                                      15 * 60 * 1000),)
    assert got.base is None


def test_a_base_url_makes_a_template_for_every_other_name(tmp_path):
    got = load(write(tmp_path, '[functions]\nbase_url = "http://127.0.0.1:3000/fn"\n'))
    assert got.named == () and got.base.url == "http://127.0.0.1:3000/fn"
    assert (got.base.concurrency, got.base.timeout_ms) == (1, 15000)


def test_under_base_url_a_table_without_url_is_that_name_at_base_url(tmp_path):
    got = load(write(tmp_path, '[functions]\nbase_url = "http://h:3000/fn/"\n'
                               '[functions.slow]\nconcurrency = 1\n'
                               '[functions.fast]\nconcurrency = 8\nurl = "http://other/f"\n'))
    assert {f.name: (f.url, f.concurrency) for f in got.named} == {
        "slow": ("http://h:3000/fn/slow", 1), "fast": ("http://other/f", 8)}


def test_with_base_url_and_tables_only_their_names_and_the_listed_ones_are_callable(tmp_path):
    got = load(write(tmp_path, '[functions]\nbase_url = "http://h"\nfunctions = ["report"]\n'
                               '[functions.slow]\nconcurrency = 1\n'))
    assert sorted(f.name for f in got.named) == ["report", "slow"]
    assert got.base is None                                   # a misspelled name is unknown
    assert [f.url for f in got.named if f.name == "report"] == ["http://h/report"]


def test_base_url_any_restores_any_name_and_silences_the_upgrade_warning(tmp_path):
    text = '[functions]\nbase_url = "http://h"\n[functions.slow]\nconcurrency = 1\n'
    old = load(write(tmp_path, text))
    assert old.base is None and old.warnings == (
        f"{tmp_path / 'zstalk.toml'}: [functions] has base_url and [functions.NAME] tables, "
        "so only slow can be called (before 0.2: any name under base_url); set "
        "base_url_any = true to call any name, or base_url_any = false to say this is meant",)
    anyname = load(write(tmp_path, text.replace("http://h\"\n", "http://h\"\nbase_url_any = true\n")))
    assert anyname.base.url == "http://h" and anyname.warnings == ()
    meant = load(write(tmp_path, text.replace("http://h\"\n", "http://h\"\nbase_url_any = false\n")))
    assert meant.base is None and meant.warnings == ()


def test_base_url_alone_still_calls_any_name_with_no_warning(tmp_path):
    got = load(write(tmp_path, '[functions]\nbase_url = "http://h"\n'))
    assert got.base is not None and got.warnings == ()


@pytest.mark.parametrize("text, size", [("300", 300), ('"300"', 300), ('"300B"', 300),
                                        ('"512KiB"', 512 << 10), ('" 4 MiB "', 4 << 20)])
def test_sizes_are_bytes_or_strings_with_a_binary_unit(tmp_path, text, size):
    got = load(write(tmp_path, f"[functions]\nmax_result = {text}\n[api]\nmax_body = {text}\n"))
    assert got.max_result_bytes == got.max_body_bytes == size
    assert load(write(tmp_path, "")).max_body_bytes == 1 << 20     # the defaults: 1 MiB


def test_allow_origins_are_kept_as_a_browser_spells_its_origin(tmp_path):
    got = load(write(tmp_path, '[functions]\nbase_url = "http://h"\nbase_url_any = true\n'
                               'allow_origins = ["https://Shop.Example:443"]\n'
                               '[functions.f]\nallow_origins = ["http://127.0.0.1:8000", '
                               '"http://[::1]:80", "https://bücher.example", '
                               '"http://127.0.0.1:8000"]\n'
                               '[functions.g]\nallow_origins = ["*"]\n[functions.h]\n'))
    origins = {f.name: f.allow_origins for f in got.named}
    assert origins == {"f": ("http://127.0.0.1:8000", "http://[::1]",
                             "https://xn--bcher-kva.example"),
                       "g": ("*",), "h": ("https://shop.example",)}     # (h: the default)
    assert got.base.allow_origins == ("https://shop.example",)
    assert load(write(tmp_path, '[functions.f]\nurl = "http://x"\n')).named[0].allow_origins == ()


def test_the_api_table_says_what_a_request_without_the_master_key_may_do(tmp_path):
    assert load(write(tmp_path, "[functions]\n")).api == ApiPolicy(False, False)
    got = load(write(tmp_path, "[api]\npublic_enqueue = true\nprivate_results = true\n"))
    assert got.api == ApiPolicy(public_enqueue=True, private_results=True)


@pytest.mark.parametrize("text, message", [
    ('[functions.f]\nurl = "ftp://x"', "url must be an http:// or https:// URL"),
    ('[functions.f]\nconcurrency = 2', "url is missing (or give [functions] base_url, or an upstream)"),
    ('[functions]\nfunctions = ["a"]', "functions lists names under base_url: give base_url"),
    ('[functions]\nbase_url = "http://h"\nfunctions = "a"', "functions is a list of function names"),
    ('[functions]\nbase_url_any = true', "base_url_any is true or false, and only with base_url"),
    ('[functions.f]\nurl = "http://x"\ntimeout = 10', "a duration is a string with a unit"),
    ('[functions.f]\nurl = "http://x"\ncolour = 1', "unknown key 'colour'"),
    ('[functions]\nconcurrency = 0', "concurrency must be an integer from 1"),
    ('[functions.f]\nurl = "http://x"\ntimeout = "20m"', "at most max_timeout"),
    ('[functions.f]\nurl = "http://x"\n[functions', "not valid TOML"),
    ('[api]\npublic_enqueue = "yes"', "[api] public_enqueue must be true or false"),
    ('[api]\npublic = true', "unknown key 'public'"),
    ('[function.f]\nurl = "http://x"', "unknown table [function]"),
    ('[api]\nmax_body = "1TB"', "[api] max_body: a size is bytes or a string with a unit"),
    ('[api]\nmax_body = 0', "from 1 byte to 64MiB"),
    ('[functions]\nmax_result = "65MiB"', "[functions] max_result: a size is"),
    ('[functions.f]\nurl = "http://x"\nmax_result = 5', "unknown key 'max_result'"),
    ('[functions.f]\nurl = "http://x"\nallow_origins = "https://shop.example"',
     '[functions.f]: allow_origins: a list of origins, like ["https://shop.example"]'),
    ('[functions.f]\nurl = "http://x"\nallow_origins = ["https://shop.example/"]',
     "[functions.f]: allow_origins: an origin has no path, query or fragment (not even \"/\")"),
    ('[functions.f]\nurl = "http://x"\nallow_origins = ["https://shop.example/cart"]',
     "https://shop.example, not 'https://shop.example/cart'"),
    ('[functions.f]\nurl = "http://x"\nallow_origins = ["null"]',
     '[functions.f]: allow_origins: "null" is the origin of sandboxed pages'),
    ('[functions]\nallow_origins = ["https://*.shop.example"]',
     "[functions]: allow_origins: 'https://*.shop.example': a wildcard is \"*\" alone"),
    ('[functions.f]\nurl = "http://x"\nallow_origins = ["shop.example"]',
     "'shop.example' is not an origin: scheme://host[:port]"),
    ('[functions.f]\nurl = "http://x"\nallow_origins = ["https://shop.example:99999"]',
     "'https://shop.example:99999' is not an origin"),
    ('[functions.f]\nurl = "http://x"\nallow_origins = ["https://me@shop.example"]',
     "'https://me@shop.example' is not an origin"),
])
def test_a_bad_file_is_refused_naming_the_file_and_the_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load(path)
    assert message in str(err.value) and path in str(err.value)


def test_a_missing_file_says_so():
    with pytest.raises(ConfigError, match="No such file"):
        load("/nonexistent/zstalk.toml")


@pytest.mark.parametrize("text, ms", [("500ms", 500), ("10s", 10_000), ("2m", 120_000),
                                      ("1h", 3_600_000), (" 3 s ", 3000)])
def test_durations_are_strings_with_units(text, ms):
    assert duration_ms(text, "x") == ms


# -- a waiting room needs the fronts' pass keys (check_passes) -----------------------------
ROOM = '[functions.checkout]\nonline = "only"\n[functions.mail]\nurl = "http://m:3000"\n'


def test_a_function_that_sets_online_needs_a_pass_key_file_named_with_the_file_and_key(
        tmp_path):
    path = write(tmp_path, ROOM)
    with pytest.raises(ConfigError) as err:
        check_passes(load(path), path, env={})
    assert str(err.value) == (
        f"{path}: [functions.checkout] online makes a waiting room, whose admitted users "
        "need passes: give --pass-key-file (ZSTALK_PASS_KEY_FILE), or --insecure to run it "
        "without passes")


def test_online_in_the_functions_defaults_makes_every_function_a_room(tmp_path):
    path = write(tmp_path, '[functions]\nbase_url = "http://h:3000"\nonline = "public"\n')
    with pytest.raises(ConfigError, match=r": \[functions\] online makes a waiting room"):
        check_passes(load(path), path, env={})


def test_online_master_written_out_needs_no_pass_key_as_when_left_unset(tmp_path):
    path = write(tmp_path, '[functions]\nbase_url = "http://h:3000"\nonline = "master"\n'
                           '[functions.mail]\nonline = "master"\n')
    assert check_passes(load(path), path, env={}) == ()


def test_a_pass_key_file_or_no_online_function_needs_nothing_more(tmp_path):
    path = write(tmp_path, ROOM)
    assert check_passes(load(path), path, env={"ZSTALK_PASS_KEY_FILE": "/keys"}) == ()
    offline = write(tmp_path, '[functions.mail]\nurl = "http://m:3000"\n')
    assert check_passes(load(offline), offline, env={}) == ()


def test_insecure_runs_a_room_without_passes_and_says_none_are_issued(tmp_path):
    path = write(tmp_path, ROOM)
    assert check_passes(load(path), path, env={"ZSTALK_INSECURE": "1"}) == (
        f"{path}: [functions.checkout] online: no --pass-key-file (ZSTALK_PASS_KEY_FILE), so "
        "passes are not issued: admitted users get none, and the gateway's verify refuses "
        "every pass (--insecure)",)
