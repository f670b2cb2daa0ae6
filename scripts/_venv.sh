# Sourced by scripts/zstalk and scripts/test: makes .venv beside the repo (once),
# installs zstalk into it, and leaves zstalk's modules byte-compiled, so a fresh
# machine needs no other step and every start reads cached bytecode.
# ZSTALK_EXTRAS selects optional dependency groups (e.g. "test,k8s").
#
# The install is editable in setuptools' "strict" mode: build/__editable__.zstalk-*/ holds
# a tree of symlinks to the sources and a .pth line puts it on sys.path, so an edit is live
# at once and nothing runs at interpreter start (the default mode's import hook costs every
# start ~10 ms of imports).  A module added or removed needs the tree rebuilt: each extra's
# stamp records the list of source files it was installed with, and a change of it installs
# again.  Bytecode is written here because Python writes none when PYTHONDONTWRITEBYTECODE
# is set (as on this project's machines and CI); compileall skips what is up to date.
# Several scripts may start at once (a README example runs two): one installs while the
# others wait on the lock, then find their stamps current.
#
# Setting up says one line per step on stderr ("zstalk: making .venv …"); what venv and pip
# say goes to .venv/install.log (pip alone can print dozens of warnings about a machine's
# pip config), which is shown, its last 30 lines, only when a step fails.  When .venv is
# current this prints nothing and adds nothing to a start.
set -eu
ROOT=$(cd -P "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
sources=$(cd "$ROOT" && find broker protocol workers -name '*.py' -o -name py.typed \
          | LC_ALL=C sort | cksum)
extras=${ZSTALK_EXTRAS:-}
needed="base ${extras//,/ }"

current() {     # every needed extra's stamp names these sources, and pyproject is older
    local extra
    why="first run"
    [ -x "$VENV/bin/python" ] || return 1
    for extra in $needed; do
        why="the $extra extra is new here"
        [ "$extra" = base ] && why="first run"      # (a first install that failed)
        [ -f "$VENV/.zstalk-installed-$extra" ] || return 1
        why="pyproject.toml changed"
        [ "$ROOT/pyproject.toml" -nt "$VENV/.zstalk-installed-$extra" ] && return 1
        why="modules were added or removed"
        [ "$(cat "$VENV/.zstalk-installed-$extra")" = "$sources" ] || return 1
    done
    return 0
}

set_up_step() {     # $1: what this step does; the rest: its command, whose output is logged
    echo "zstalk: $1 …" >&2
    shift
    if ! "$@" >>"$VENV/install.log" 2>&1; then
        echo "zstalk: that failed; the log is $VENV/install.log, which ends:" >&2
        tail -n 30 "$VENV/install.log" | sed 's/^/    /' >&2
        exit 1
    fi
}

if ! current; then
    mkdir -p "$VENV"
    exec 9>"$VENV/.zstalk-install.lock"
    if ! flock -n 9; then
        echo "zstalk: waiting for another process setting up .venv …" >&2
        flock 9
    fi
    if ! current; then
        : >"$VENV/install.log"
        [ -x "$VENV/bin/pip" ] || set_up_step "making .venv (first run)" python3 -m venv "$VENV"
        spec="$ROOT"
        [ -n "$extras" ] && spec="$ROOT[$extras]"
        detail="extras: ${extras:-none}"
        [ "$why" = "first run" ] || detail="$detail; $why"
        set_up_step "installing zstalk and its packages into .venv ($detail)" \
            "$VENV/bin/pip" install --disable-pip-version-check \
            --config-settings editable_mode=strict -e "$spec"
        for extra in $needed; do
            printf '%s\n' "$sources" > "$VENV/.zstalk-installed-$extra"
        done
        echo "zstalk: compiling zstalk's modules …" >&2
    fi
    "$VENV/bin/python" -m compileall -q "$ROOT"/build/__editable__.zstalk-*/zstalk >&2
    flock -u 9
    exec 9>&-
else
    "$VENV/bin/python" -m compileall -q "$ROOT"/build/__editable__.zstalk-*/zstalk >&2
fi
