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
set -eu
ROOT=$(cd -P "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
sources=$(cd "$ROOT" && find broker protocol workers -name '*.py' -o -name py.typed \
          | LC_ALL=C sort | cksum)
extras=${ZSTALK_EXTRAS:-}
needed="base ${extras//,/ }"

current() {     # every needed extra's stamp names these sources, and pyproject is older
    local extra
    [ -x "$VENV/bin/python" ] || return 1
    for extra in $needed; do
        [ -f "$VENV/.zstalk-installed-$extra" ] || return 1
        [ "$ROOT/pyproject.toml" -nt "$VENV/.zstalk-installed-$extra" ] && return 1
        [ "$(cat "$VENV/.zstalk-installed-$extra")" = "$sources" ] || return 1
    done
    return 0
}

if ! current; then
    mkdir -p "$VENV"
    exec 9>"$VENV/.zstalk-install.lock"
    flock 9
    if ! current; then
        [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" >&2
        spec="$ROOT"
        [ -n "${ZSTALK_EXTRAS:-}" ] && spec="$ROOT[$ZSTALK_EXTRAS]"
        "$VENV/bin/pip" install -q --disable-pip-version-check \
            --config-settings editable_mode=strict -e "$spec" >&2
        for extra in $needed; do
            printf '%s\n' "$sources" > "$VENV/.zstalk-installed-$extra"
        done
    fi
    "$VENV/bin/python" -m compileall -q "$ROOT"/build/__editable__.zstalk-*/zstalk >&2
    flock -u 9
    exec 9>&-
else
    "$VENV/bin/python" -m compileall -q "$ROOT"/build/__editable__.zstalk-*/zstalk >&2
fi
