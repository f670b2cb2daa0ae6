# Sourced by scripts/zstalk and scripts/test: makes .venv beside the repo (once)
# and installs zstalk into it, so a fresh machine needs no other step.
# ZSTALK_EXTRAS selects optional dependency groups (e.g. "test").
set -eu
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
stamp="$VENV/.zstalk-installed-${ZSTALK_EXTRAS:-base}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV" >&2
fi
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
    spec="$ROOT"
    [ -n "${ZSTALK_EXTRAS:-}" ] && spec="$ROOT[$ZSTALK_EXTRAS]"
    "$VENV/bin/pip" install -q --disable-pip-version-check -e "$spec" >&2
    touch "$stamp"
fi
