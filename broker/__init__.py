"""zstalk.broker: the broker actor (actor.py) and its config file (config_file.py), the pure
state core it drives (core/), durability (wal/), and the commands that wire the actors
together (run/)."""

VERSION = "0.1.0"
