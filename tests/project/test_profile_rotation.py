"""scripts/profile_rotation.py, the task store's own CPU per task in process (issue 44), and
its fairness run on the store's fake clock: run as a user would, its figures read back."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "profile_rotation.py"


def run(*args: str) -> str:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_each_task_of_a_small_group_starts_after_one_of_a_big_group_s():
    said = run("--fairness", "--seconds", "10")
    assert "how many of small's: {1: 10}" in said, said


def test_it_reports_cpu_per_task_for_each_group_count():
    said = run("--tasks", "500", "--groups", "0,100", "--repeats", "1")
    for groups in ("0", "100"):
        found = re.search(rf"groups +{groups}: enqueue +([\d.]+) us/task, take\+outcome +"
                          rf"([\d.]+) us/task", said)
        assert found and float(found.group(1)) > 0 and float(found.group(2)) > 0, said
