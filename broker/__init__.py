"""zstalk.broker: the broker actor (actor.py) and its config file (config_file.py), the pure
state core it drives (core/), durability (wal/), and the commands that wire the actors
together (run/)."""

__all__ = ["VERSION"]


def __getattr__(name: str):
    """zstalk.broker.VERSION, as before; loaded on first use, so that a command's first
    line (run/__init__.py's tune_gc) runs before the schema's modules load."""
    if name == "VERSION":
        from ..protocol.schema.version import VERSION
        return VERSION
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
