# The benchmark tables of docs/performance.md (once the README's), rewritten from a
# benchmark's JSON, so they never drift from the code that measures them.
#
# Each table sits between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->` on lines of
# their own; NAME is a table's name in the JSON (bench_beanstalk writes "beanstalk" or,
# with --fronts 0,1, "placement"; bench_curve "curve" and "curve-flood"...).  What is
# between them is replaced whole: a caption line (when, on what machine, at what load
# average and calibration, how many runs, by which command), the table's note (what is
# compared, from the benchmark's code) and the Markdown table.
from __future__ import annotations

import re


class MarkerError(ValueError):
    pass


def markers(text: str) -> list[str]:
    """The NAMEs of a page's bench blocks, in order."""
    return re.findall(r"^<!-- bench:([\w.-]+) -->$", text, re.M)


def block(doc: dict, table: dict, command: str) -> str:
    """A table's block: caption, note, Markdown."""
    m = doc["machine"]
    load = " / ".join(f"{x:.2f}" for x in m["loadavg"])
    caption = (f"*Measured {m['date']} on {m['nproc']} × {m['cpu']} (Linux {m['kernel']}, "
               f"Python {m['python']}), load average {load}, calibration "
               f"{m['calibration_mturns_s']:.1f} M loop turns/s on one core; {doc['method']}; "
               f"`{command}`, by `scripts/bench_readme`.*")
    parts = [caption] + ([table["note"].strip()] if table.get("note", "").strip() else [])
    return "\n\n".join(parts + [table["markdown"]])


def replace(text: str, name: str, body: str) -> str:
    """`text` with the block NAME's content replaced by `body`."""
    pattern = re.compile(rf"(^<!-- bench:{re.escape(name)} -->\n)(.*?)(^<!-- /bench:"
                         rf"{re.escape(name)} -->$)", re.M | re.S)
    found = pattern.findall(text)
    if len(found) != 1:
        raise MarkerError(f"{len(found)} blocks <!-- bench:{name} --> ... "
                          f"<!-- /bench:{name} --> (need exactly one)")
    return pattern.sub(lambda mo: mo.group(1) + body.rstrip("\n") + "\n" + mo.group(3), text)
