"""zstalk's version: what `--version` prints, the start lines say and zstalk_build_info
carries (every role, from the broker to a worker pool, reads it here)."""

VERSION = "0.2.0"
