# Every benchmark runs under the project's .venv/bin/python, however it is started
# (`scripts/bench_<name>.py`, `python3 scripts/bench_<name>.py`, or that python itself).
#
# use_project_venv() is the first thing a benchmark does, before it imports anything
# beyond the standard library: when the running interpreter is not the project's .venv,
# it sources scripts/_venv.sh as scripts/zstalk does (which makes .venv on a fresh
# machine and keeps zstalk installed and byte-compiled in it; with the test extras, for
# greenstalk, which bench_workers drives beanstalkd with) and re-execs the same command
# line under .venv/bin/python.  Children a benchmark starts with another tree's python
# (--against) carry ZSTALK_BENCH_CHILD=1 and are left where they are.
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv"
CHILD_ENV = "ZSTALK_BENCH_CHILD"


def use_project_venv() -> None:
    if os.environ.get(CHILD_ENV) or Path(sys.prefix).resolve() == VENV.resolve():
        return
    env = dict(os.environ, ZSTALK_EXTRAS=os.environ.get("ZSTALK_EXTRAS") or "test")
    done = subprocess.run(["bash", "-c", f'source "{REPO}/scripts/_venv.sh"'], env=env)
    if done.returncode:
        sys.exit(f"{sys.argv[0]}: could not make {VENV} (scripts/_venv.sh exited "
                 f"{done.returncode})")
    python = str(VENV / "bin" / "python")
    os.execv(python, [python, os.path.abspath(sys.argv[0]), *sys.argv[1:]])
