#!/usr/bin/env python3
"""The manual's references, made from the code so they cannot drift from it.

    docs/reference/config.md   the config file's keys: broker/config_file.py's KEYS, the table
                               the reader refuses unknown keys and takes its defaults from
    docs/reference/cli.md      every `zstalk` command's --help, from the click commands
                               themselves (broker/run/cli.py), and zstalkd's usage

`scripts/docs_reference.py` rewrites both; `--check` only says which differ (exit 1).
tests/project/test_docs.py fails while either differs from what this makes.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 100             # the help's width, fixed so the page does not follow a terminal


def toml(value) -> str:
    """A default as it is written in the file."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{json.dumps(value)}`"


def config_page() -> str:
    from zstalk.broker import config_file as cf
    lines = [
        "# Config file keys",
        "",
        "<!-- made by scripts/docs_reference.py from broker/config_file.py's KEYS -->",
        "",
        "Every key `zstalk serve --config FILE` and `zstalk broker --config FILE` read. The reader",
        "refuses any other key, naming the file and the table, and takes the defaults below",
        "from this same table. Durations are strings with a unit (`\"500ms\"`, `\"10s\"`, `\"2m\"`,",
        f"`\"1h\"`); sizes are bytes or strings with a binary unit (`\"512KiB\"`), at most "
        f"{cf.MAX_SIZE >> 20} MiB.",
        "What each does, with examples: [Cloud tasks](../tasks.md), [Limits](../limits.md),",
        "[Request tasks](../request-tasks.md), [Upstream groups](../upstreams.md),",
        "[The waiting room](../waiting-room.md).",
    ]
    groups: dict[tuple[str, ...], list] = {}
    for key in cf.KEYS:
        groups.setdefault(key.tables, []).append(key)
    for tables, keys in groups.items():
        lines += ["", "## " + " and ".join(f"`{t}`" for t in tables), "",
                  "| key | type | default | unit | what |", "|---|---|---|---|---|"]
        lines += [f"| `{k.name}` | {k.type} | {toml(k.default)} | {k.unit} | "
                  f"{k.help.replace('|', '&#124;')} |" for k in keys]
    return "\n".join(lines) + "\n"


def commands(group, path: tuple[str, ...]):
    """(command path, command) for the group and everything under it, in the help's order
    (asked by name: `zstalk`'s operator commands load when asked for, cli.py's LAZY)."""
    import click
    yield path, group
    if isinstance(group, click.Group):
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            yield from commands(group.get_command(ctx, name), path + (name,))


def cli_page() -> str:
    import click
    from zstalk.broker.run import cli, dropin
    lines = [
        "# Command line",
        "",
        "<!-- made by scripts/docs_reference.py from the click commands (broker/run/cli.py) -->",
        "",
        "Each command's `--help`, as it prints it. What the options do together is in",
        "[Running zstalk](../running.md); the beanstalkd drop-in `zstalkd` is at the end.",
    ]
    for path, command in commands(cli.main, ("zstalk",)):
        ctx = click.Context(command, info_name=path[-1], parent=_parents(path, cli.main),
                            terminal_width=WIDTH, max_content_width=WIDTH)
        lines += ["", f"## {' '.join(path)}", "", "```text", command.get_help(ctx).rstrip(),
                  "```"]
    lines += ["", "## zstalkd", "", "beanstalkd's flags, parsed as beanstalkd parses them:",
              "", "```text", dropin.USAGE.format(prog="zstalkd").rstrip(), "```"]
    return "\n".join(lines) + "\n"


def _parents(path: tuple[str, ...], main):
    """The click contexts of `path`'s parents, so its usage line names them all."""
    import click
    ctx, command = None, main
    for i, name in enumerate(path[:-1]):
        if i:
            command = command.get_command(ctx, name)
        ctx = click.Context(command, info_name=name, parent=ctx,
                            terminal_width=WIDTH, max_content_width=WIDTH)
    return ctx


PAGES = {"docs/reference/config.md": config_page, "docs/reference/cli.md": cli_page}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, make in PAGES.items():
        path, text = ROOT / name, make()
        if not path.exists() or path.read_text() != text:
            stale.append(name)
            if not check:
                path.write_text(text)
    for name in stale:
        print(f"{name} {'differs from the code' if check else 'rewritten'}", file=sys.stderr)
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "scripts"))
    from harness.venv import use_project_venv
    use_project_venv()
    sys.exit(main(sys.argv[1:]))
