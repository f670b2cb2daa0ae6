"""The manual (docs/, mkdocs.yml) and what it is made from: MkDocs builds it in strict mode
(a broken link or anchor, a page left out of the nav, fails), the references under
docs/reference/ are what scripts/docs_reference.py makes from the code (the config reader's
KEYS, the click commands), every key of KEYS is one the reader takes at the default the
table gives, and the README stays a front door whose links reach their files.  Its examples
run in test_readme.py, beside the manual's."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from zstalk.broker import config_file as cf
from zstalk.broker.core.tasks.store import ApiPolicy
from zstalk.protocol.schema.version import VERSION

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reference():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import docs_reference
        yield docs_reference
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def test_mkdocs_builds_the_manual_in_strict_mode(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "reference" / "config.html").exists()


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
                                           cf.SERVER, cf.HEALTH}


def test_the_api_keys_are_the_api_policy_and_its_defaults_the_policy_defaults():
    assert cf.keys_of(cf.API) == {*ApiPolicy._fields, "max_body"}
    assert {k.name: k.default for k in cf.KEYS if cf.API in k.tables and k.name != "max_body"} \
        == ApiPolicy._field_defaults


def links(path: Path) -> list[str]:
    return [target for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text())
            if not re.match(r"[a-z]+:", target)]


def test_every_link_of_the_readme_reaches_a_file():
    missing = [t for t in links(ROOT / "README.md")
               if not (ROOT / t.partition("#")[0]).exists()]
    assert missing == []


def test_the_readme_is_a_front_door_of_about_250_lines_that_links_every_feature_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 275
    pages = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")}
    assert pages - {"docs/index.md"} <= {t.partition("#")[0] for t in links(ROOT / "README.md")}


def moved_paths(text: str) -> str:
    """The table of module paths that moved, `| was | now |` to its last row."""
    return re.search(r"^\| was \| now \|\n(?:\|.*\n)+", text, re.M)[0]


def test_the_changelog_starts_at_this_version_with_the_upgrade_pages_table_of_moves():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## (\S+)", changelog, re.M)
    if versions[0] == "Unreleased":     # (what the next version brings, collected above it)
        versions.pop(0)
    assert versions[0] == VERSION
    assert moved_paths(changelog) == moved_paths(
        (ROOT / "docs" / "operations" / "upgrades.md").read_text())
