"""The wiring above the actors: the `zstalk` and `zstalkd` commands, the one-process
server, the supervisor of front processes, and the settings each actor is built from.
No actor imports this package."""

#: the cyclic garbage collector's thresholds in zstalk's processes (gc.set_threshold)
GC_THRESHOLDS = (50_000, 20, 20)


def tune_gc() -> None:
    """Collect cycles every 50,000 allocations, not CPython's 700: the broker, the fronts
    and the dispatchers (not worker pools, which run their users' code).  A broker's heap
    is mostly jobs, which never form reference cycles, and a process that holds a million
    of them spent a fifth of its CPU on pipelined puts walking them in the collector; an
    HTTP front keeps a future and a reply per task of an array in flight, and spent a
    sixth of its CPU per task on them (10.1 -> 8.4 us a task in arrays of 1,000).  Cycles
    among zstalk's own objects are broken where they end (a closed session leaves its
    front), and aiohttp's per request are few, so the garbage left between collections
    is a few MiB at most.  The commands call it first, before their imports: module
    bodies allocate many objects that live on, and collecting them at 700 took ~4 ms of
    zstalkd's ~90 ms to its first answer."""
    import gc
    gc.set_threshold(*GC_THRESHOLDS)
