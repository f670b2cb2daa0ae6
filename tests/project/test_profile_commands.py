"""scripts/profile_commands.py, which counts a beanstalk command's Python calls by layer on
the in-process path (the figures issue 41's cuts are judged by): it runs, every layer it
names gets the calls made there, and a call added to one layer shows up as exactly one more
per command there and nowhere else."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from servers import self_check

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "profile_commands.py"

pytestmark = pytest.mark.skipif(self_check(), reason="it measures zstalk itself")


def profile(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "profile.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--count", "300", "--repeats", "1",
                           "--json", str(out), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "put: Python calls" in done.stdout and "reserve+delete: CPU µs" in done.stdout
    return json.loads(out.read_text())["results"][0]


def test_each_command_is_counted_in_the_layers_it_passes_through(tmp_path):
    result = profile(tmp_path)
    for load in ("put", "reserve+delete"):
        calls = result[load]["calls"]
        for layer in ("front + parser", "link", "actor turn", "core: beanstalk",
                      "core: routing, replies, timers, journal", "builtins"):
            assert calls[layer] >= 1, (load, layer, calls)
        assert result[load]["calls_total"] == pytest.approx(sum(calls.values()), abs=0.2)
        assert result[load]["cpu_median_us"] > 0


def test_one_more_call_per_command_in_a_layer_counts_as_one_more_there(tmp_path, monkeypatch):
    sitecustomize = tmp_path / "site" / "sitecustomize.py"     # wraps the core's put once
    sitecustomize.parent.mkdir()
    sitecustomize.write_text(
        "from zstalk.broker.core.beanstalk import commands\n"
        "_put = commands.BeanstalkCommands.put\n"
        "exec(compile('def put(self, s, op, now):\\n    return _put(self, s, op, now)\\n',\n"
        "             commands.__file__, 'exec'), globals())\n"
        "commands.BeanstalkCommands.put = put\n")
    before = profile(tmp_path)["put"]["calls"]
    monkeypatch.setenv("PYTHONPATH", str(sitecustomize.parent))
    after = profile(tmp_path)["put"]["calls"]
    assert after["core: beanstalk"] == pytest.approx(before["core: beanstalk"] + 1, abs=0.05)
    assert {k: v for k, v in after.items() if k != "core: beanstalk"} == pytest.approx(
        {k: v for k, v in before.items() if k != "core: beanstalk"}, abs=0.05)
