"""The references under docs/reference/ are what scripts/docs_reference.py makes from the code
(the config reader's KEYS, the click commands), and every key of KEYS is one the reader takes
at the default the table gives."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from zstalk.broker import config_file as cf
from zstalk.broker.core.tasks.store import ApiPolicy

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reference():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import docs_reference
        yield docs_reference
    finally:
        sys.path.remove(str(ROOT / "scripts"))


@pytest.mark.parametrize("page", ["docs/reference/config.md", "docs/reference/cli.md"])
def test_each_reference_is_what_the_code_makes(reference, page):
    assert (ROOT / page).read_text() == reference.PAGES[page](), (
        f"{page} differs from the code: run scripts/docs_reference.py")


def toml(value) -> str:
    return str(value).lower() if isinstance(value, bool) else json.dumps(value)


def at_defaults(table: str) -> str:
    return "".join(f"{k.name} = {toml(k.default)}\n" for k in cf.KEYS
                   if table in k.tables and k.default is not None)


@pytest.mark.parametrize("bare, table", [
    ("[api]\n", cf.API),
    ('[functions]\nbase_url = "http://h:3000"\n', cf.FUNCTIONS),
    ('[functions.f]\nurl = "http://h:3000/f"\n', cf.FUNCTION),
    ('[upstreams.u]\nservers = [{ url = "http://h:1" }]\n', cf.UPSTREAM),
])
def test_every_key_written_at_the_default_the_table_gives_changes_nothing(tmp_path, bare, table):
    plain, written = tmp_path / "plain.toml", tmp_path / "written.toml"
    plain.write_text(bare)
    servers = "".join(f", {k.name} = {toml(k.default)}" for k in cf.KEYS
                      if cf.SERVER in k.tables and k.default is not None)
    written.write_text(bare.replace('"http://h:1" }', f'"http://h:1"{servers} }}')
                       + at_defaults(table))
    # (any `online` written makes a waiting room that asks for pass keys, even "master")
    assert cf.load(str(written))._replace(online_keys=()) == cf.load(str(plain))


def test_the_table_has_each_key_once_per_table_and_only_the_reader_tables():
    seen = [(table, k.name) for k in cf.KEYS for table in k.tables]
    assert len(seen) == len(set(seen))
    assert {table for table, _ in seen} == {cf.API, cf.FUNCTIONS, cf.FUNCTION, cf.UPSTREAM,
                                           cf.SERVER}


def test_the_api_keys_are_the_api_policy_and_its_defaults_the_policy_defaults():
    assert cf.keys_of(cf.API) == {*ApiPolicy._fields, "max_body"}
    assert {k.name: k.default for k in cf.KEYS if cf.API in k.tables and k.name != "max_body"} \
        == ApiPolicy._field_defaults
