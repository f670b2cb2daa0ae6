# The two set-up scripts as a newcomer meets them: what they say, and when they stop.
#
# scripts/test checks ZSTALK_TEST_SKIP before anything else, so those tests run a copy of
# scripts/ in an empty directory: had the script gone on, it would have made .venv there,
# and they check it did not.  A skipped group's tests are run by an inner pytest with the
# variable set and CI unset (that run stands for a local one); under CI=true the same run
# must fail instead, which is checked too.  scripts/_venv.sh runs for real, through
# scripts/zstalk, on a copy of the sources: a fresh .venv with the examples extra took 20 s
# on a loaded 2-core machine, nearly all of it pip, so the windows here are generous.
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from servers import SKIPPABLE_GROUPS

ROOT = Path(__file__).resolve().parents[2]
#: one test of each group's, each asking for the group before it starts anything
NEEDS_A_GROUP = {
    "browser": "tests/fronts/test_cors.py::test_a_browser_page_from_a_listed_origin_joins_reads_and_ends_"
               "its_task_and_others_cannot",
    "prometheus": "tests/end_to_end/test_metrics_end_to_end.py::test_a_real_prometheus_scrapes_serve_and_"
                  "answers_the_readmes_queries",
    "image": "tests/deploy/test_image.py::test_the_image_runs_zstalk_as_uid_10001_in_an_empty_app_directory",
}
#: what a skipped group's tests say, for ZSTALK_TEST_SKIP=browser,image,prometheus
SKIPPED = {
    "browser": "needs chromium (the browser group): ZSTALK_TEST_SKIP=browser,image,prometheus "
               "skipped its install",
    "prometheus": "needs prometheus (the prometheus group): ZSTALK_TEST_SKIP=browser,image,"
                  "prometheus skipped its install",
    "image": "needs podman, buildah, mmdebstrap (the image group): ZSTALK_TEST_SKIP=browser,image,"
             "prometheus skipped its install",
}


def environment(**changes: str) -> dict[str, str]:
    """This process's environment without CI, ZSTALK_TEST_SKIP and the self-check switch,
    with `changes`."""
    kept = {k: v for k, v in os.environ.items()
            if k not in ("CI", "ZSTALK_TEST_SKIP", "ZSTALK_TEST_SELF_CHECK")}
    return {**kept, **changes}


def run_a_copy_of_scripts_test(where: Path, **env: str) -> subprocess.CompletedProcess:
    (where / "scripts").mkdir()
    for name in ("test", "_venv.sh"):
        shutil.copy(ROOT / "scripts" / name, where / "scripts" / name)
    return subprocess.run(["bash", str(where / "scripts" / "test")], env=environment(**env),
                          cwd=where, capture_output=True, text=True, timeout=120)


def test_under_CI_a_ZSTALK_TEST_SKIP_is_refused_before_anything_is_installed_or_run(tmp_path):
    done = run_a_copy_of_scripts_test(tmp_path, CI="true", ZSTALK_TEST_SKIP="browser")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("scripts/test: ZSTALK_TEST_SKIP=browser is refused under CI=true: "
                           "CI runs every test\n")
    assert not (tmp_path / ".venv").exists()


def test_an_unknown_group_in_ZSTALK_TEST_SKIP_is_refused_naming_the_groups(tmp_path):
    done = run_a_copy_of_scripts_test(tmp_path, ZSTALK_TEST_SKIP="browser,browsers")
    assert (done.returncode, done.stdout) == (2, "")
    [line] = done.stderr.splitlines()
    assert line.startswith("scripts/test: ZSTALK_TEST_SKIP names 'browsers', which is not a "
                           "group it can skip; those are: "), line
    named = re.search(r"those are: (.*?) \(", line)[1].split(", ")
    assert named == list(SKIPPABLE_GROUPS)          # (the tests' helper knows the same groups)
    assert not (tmp_path / ".venv").exists()


def test_the_reference_group_cannot_be_skipped(tmp_path):
    done = run_a_copy_of_scripts_test(tmp_path, ZSTALK_TEST_SKIP="reference")
    assert done.returncode == 2
    assert "(the reference group cannot be skipped: most tests compare against it)" in done.stderr
    assert not (tmp_path / ".venv").exists()


def run_inner_pytest(tmp_path: Path, tests: list[str], **env: str) -> dict[str, tuple[str, str]]:
    """{test name: (outcome, message)} of an inner pytest run of `tests`."""
    report = tmp_path / "report.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    f"--junitxml={report}", *tests], cwd=ROOT, env=environment(**env),
                   capture_output=True, text=True, timeout=300)
    results = {}
    for case in ElementTree.parse(report).iter("testcase"):
        outcome = next(iter(case), None)
        results[case.get("name")] = ("passed", "") if outcome is None else (
            outcome.tag, outcome.get("message", ""))
    return results


def test_a_skipped_groups_tests_skip_saying_ZSTALK_TEST_SKIP_skipped_its_install(tmp_path):
    results = run_inner_pytest(tmp_path, list(NEEDS_A_GROUP.values()),
                               ZSTALK_TEST_SKIP="browser,image,prometheus")
    for group, test in NEEDS_A_GROUP.items():
        outcome, message = results[test.rsplit("::", 1)[1]]
        assert outcome == "skipped", (group, outcome, message)
        assert message.endswith(SKIPPED[group]), message


def test_under_CI_a_skipped_groups_tests_fail_instead(tmp_path):
    test = NEEDS_A_GROUP["browser"]
    results = run_inner_pytest(tmp_path, [test], CI="true", ZSTALK_TEST_SKIP="browser")
    outcome, message = results[test.rsplit("::", 1)[1]]
    assert outcome == "failure", (outcome, message)
    assert ("needs chromium (the browser group): ZSTALK_TEST_SKIP=browser skipped its install "
            "(CI=true: this test must not be skipped)") in message


# -- scripts/_venv.sh ------------------------------------------------------------------------
def a_checkout(where: Path) -> Path:
    """What scripts/zstalk needs of a clone: the sources, the scripts, pyproject and README."""
    checkout = where / "checkout"
    for name in ("broker", "protocol", "workers", "scripts"):
        shutil.copytree(ROOT / name, checkout / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, checkout / name)
    return checkout


def scripts_zstalk(checkout: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(checkout / "scripts" / "zstalk"), *argv], cwd=checkout,
                          env=environment(), capture_output=True, text=True, timeout=900)


def test_a_first_scripts_zstalk_says_one_line_per_set_up_step_and_nothing_once_set_up(tmp_path):
    checkout = a_checkout(tmp_path)
    try:
        first = scripts_zstalk(checkout, "--version")
        assert first.returncode == 0, first.stderr
        assert first.stdout.startswith("zstalk, version ")
        assert first.stderr.splitlines() == [
            "zstalk: making .venv (first run) …",
            "zstalk: installing zstalk and its packages into .venv (extras: examples) …",
            "zstalk: compiling zstalk's modules …"], first.stderr
        log = (checkout / ".venv" / "install.log").read_text()
        assert "Successfully installed" in log, log[-3000:]
        again = scripts_zstalk(checkout, "--version")
        assert (again.returncode, again.stdout, again.stderr) == (0, first.stdout, "")
    finally:
        shutil.rmtree(checkout, ignore_errors=True)     # (a venv: tens of MB)


def test_a_failed_install_names_its_log_and_shows_how_it_ends(tmp_path):
    checkout = a_checkout(tmp_path)
    try:
        with open(checkout / "pyproject.toml", "a") as pyproject:
            pyproject.write("not [toml\n")
        done = scripts_zstalk(checkout, "--version")
        assert (done.returncode, done.stdout) == (1, ""), done.stderr
        log = checkout / ".venv" / "install.log"
        said = done.stderr.splitlines()
        assert said[:3] == [
            "zstalk: making .venv (first run) …",
            "zstalk: installing zstalk and its packages into .venv (extras: examples) …",
            f"zstalk: that failed; the log is {log}, which ends:"], done.stderr
        ending = log.read_text().splitlines()[-30:]
        assert said[3:] == [f"    {line}" for line in ending]
        assert "TOMLDecodeError" in done.stderr
    finally:
        shutil.rmtree(checkout, ignore_errors=True)
