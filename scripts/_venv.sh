# Sourced by scripts/zstalk and scripts/test: makes .venv beside the repo (once),
# installs zstalk into it, and leaves zstalk's modules byte-compiled, so a fresh
# machine needs no other step and every start reads cached bytecode.
# ZSTALK_EXTRAS selects optional dependency groups (e.g. "test").
#
# The install is editable in setuptools' "strict" mode: build/__editable__.zstalk-*/ holds
# a tree of symlinks to the sources and a .pth line puts it on sys.path, so an edit is live
# at once and nothing runs at interpreter start (the default mode's import hook costs every
# start ~10 ms of imports).  A module added or removed needs the tree rebuilt: the stamp
# records the list of source files, and a change of it installs again.  Bytecode is
# written here because Python writes none when PYTHONDONTWRITEBYTECODE is set (as on this
# project's machines and CI); compileall skips what is up to date.
set -eu
ROOT=$(cd -P "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
stamp="$VENV/.zstalk-installed-${ZSTALK_EXTRAS:-base}"
sources=$(cd "$ROOT" && find broker protocol workers -name '*.py' -o -name py.typed \
          | LC_ALL=C sort | cksum)
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV" >&2
fi
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ] \
        || [ "$(cat "$stamp")" != "$sources" ]; then
    spec="$ROOT"
    [ -n "${ZSTALK_EXTRAS:-}" ] && spec="$ROOT[$ZSTALK_EXTRAS]"
    "$VENV/bin/pip" install -q --disable-pip-version-check \
        --config-settings editable_mode=strict -e "$spec" >&2
    printf '%s\n' "$sources" > "$stamp"
fi
"$VENV/bin/python" -m compileall -q "$ROOT"/build/__editable__.zstalk-*/zstalk >&2
