"""The operator's commands: `zstalk tasks | functions | schedules` (operator.py), `zstalk
stats` (stats.py) and `zstalk top` (top.py), each a client of a running server over its
HTTP API (or, for stats and top, the plain protocols).  They sit above the rest of the
wiring, whose options they share (cli.py's master-key options): cli.py's LAZY finds them
by name and imports them only when one runs, so nothing on serve's or zstalkd's start
path imports this package (tests/end_to_end/test_start_path.py)."""
