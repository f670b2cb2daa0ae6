# The versions of zstalk a benchmark runs: this tree, and with --against REF a build of
# REF beside it.
#
# A Build is a source tree with its own .venv; the benchmark starts its servers through
# that venv's console scripts (`.venv/bin/zstalk`, `.venv/bin/zstalkd`) and runs any
# SDK client of it through that venv's python, never by importing zstalk itself, so
# two versions can run side by side in one benchmark process.
#
# --against REF resolves REF (any git ref or commit of this repository) to its commit
# and builds it once into ~/.cache/zstalk-bench/<commit>/ ($ZSTALK_BENCH_CACHE, else
# $XDG_CACHE_HOME/zstalk-bench): the commit's files as `git archive` writes them (no
# worktree is registered in the shared .git, so deleting the cache leaves nothing
# behind), then a venv made the tree's own way: sourcing its scripts/_venv.sh where it
# has one (an editable install, byte-compiled, with the `ha` extra where the commit has
# one: the journal's benchmark runs its --journal too), else `pip install -e .`.  The build is
# keyed by the full commit id, made under a lock (two benchmarks may ask at once), and
# marked done by a `.built` file only once the venv has its console scripts; a failed
# build is removed and tried again next time.  `--against HEAD` on a clean tree is an
# A/A run: how far its ratios stray from 1.00x is the run-to-run noise.
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class BuildError(RuntimeError):
    pass


def cache_dir() -> Path:
    if os.environ.get("ZSTALK_BENCH_CACHE"):
        return Path(os.environ["ZSTALK_BENCH_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "zstalk-bench"


def git(*args: str) -> str:
    out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                         timeout=60)
    if out.returncode:
        raise BuildError(f"git {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout.strip()


class Build:
    """One zstalk tree and its venv; `label` names its column in the tables."""

    def __init__(self, label: str, root: Path, ref: str, commit: str, dirty: bool = False):
        self.label, self.root, self.ref, self.commit, self.dirty = label, root, ref, commit, dirty

    @property
    def bin(self) -> Path:
        return self.root / ".venv" / "bin"

    def exe(self, name: str = "zstalk") -> str:
        return str(self.bin / name)

    @property
    def python(self) -> str:
        return self.exe("python")

    def describe(self) -> str:
        dirty = " + uncommitted changes" if self.dirty else ""
        return f"{self.label} = {self.commit[:10]}{dirty} ({self.root})"

    def as_json(self) -> dict:
        return dict(label=self.label, ref=self.ref, commit=self.commit, dirty=self.dirty,
                    root=str(self.root))


def current() -> Build:
    """This tree, as it is (uncommitted changes included), with the project's .venv."""
    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (BuildError, OSError):
        commit, dirty = "?", False
    return Build("zstalk", REPO, "(working tree)", commit, dirty)


def against(ref: str, log=print) -> Build:
    """REF built once into the cache (see above)."""
    commit = git("rev-parse", "--verify", f"{ref}^{{commit}}")
    home = cache_dir() / commit
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f"{commit}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / ".built").exists() or not (home / ".venv/bin/zstalk").exists():
            log(f"building zstalk@{ref} ({commit[:10]}) in {home} (once; a minute or two)")
            t0 = time.monotonic()
            shutil.rmtree(home, ignore_errors=True)
            try:
                _export(commit, home)
                _make_venv(home)
            except BaseException:
                shutil.rmtree(home, ignore_errors=True)
                raise
            (home / ".built").write_text(json.dumps(dict(
                ref=ref, commit=commit, built=time.strftime("%Y-%m-%d %H:%M:%S"),
                seconds=round(time.monotonic() - t0, 1))) + "\n")
    return Build(f"zstalk@{ref}", home, ref, commit)


def _export(commit: str, home: Path) -> None:
    home.mkdir(parents=True)
    arch = subprocess.Popen(["git", "-C", str(REPO), "archive", "--format=tar", commit],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with tarfile.open(fileobj=arch.stdout, mode="r|") as tar:
        tar.extractall(home, filter="data")
    if arch.wait() != 0:
        raise BuildError(f"git archive {commit}: {arch.stderr.read().decode()[-2000:]}")


def _make_venv(home: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("ZSTALK_EXTRAS", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    if _has_extra(home, "ha"):          # (--journal: bench_journal runs the ref's too)
        env["ZSTALK_EXTRAS"] = "ha"
    if (home / "scripts" / "_venv.sh").exists():
        steps = [["bash", "-c", "source scripts/_venv.sh"]]
    else:
        steps = [[_system_python(), "-m", "venv", ".venv"],
                 [".venv/bin/pip", "install", "-q", "--disable-pip-version-check", "-e", "."]]
    for argv in steps:
        out = subprocess.run(argv, cwd=home, env=env, capture_output=True, text=True,
                             timeout=1800)
        if out.returncode:
            raise BuildError(f"{' '.join(argv)} in {home} failed ({out.returncode}): "
                             f"{(out.stdout + out.stderr)[-3000:]}")
    if not (home / ".venv/bin/zstalk").exists():
        raise BuildError(f"{home}/.venv has no zstalk console script after the install")


def _has_extra(home: Path, name: str) -> bool:
    """Whether the build's pyproject.toml declares the optional dependency group `name`."""
    try:
        text = (home / "pyproject.toml").read_text()
    except OSError:
        return False
    return any(line.startswith(f"{name} = [") for line in text.splitlines())


def _system_python() -> str:
    """The interpreter our venv was made from (python3 on PATH may be a venv's)."""
    return getattr(sys, "_base_executable", None) or shutil.which("python3") or "python3"


def builds(ref: str | None, log=print) -> list[Build]:
    return [current()] + ([against(ref, log)] if ref else [])
