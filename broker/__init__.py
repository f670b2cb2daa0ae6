"""zstalk.broker: the broker actor (actor.py) and its config file (config_file.py), the pure
state core it drives (core/), durability (wal/), and the commands that wire the actors
together (run/)."""

from ..protocol.schema.version import VERSION     # (zstalk.broker.VERSION, as before)

__all__ = ["VERSION"]
