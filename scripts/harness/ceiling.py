# Whether a row measures its servers or its load generator: the rule that marks a row
# "generator-bound", and the words the tables say it in.
#
# One command at a time, a client waits for every reply, so its rate is one round trip,
# and the client's own part of that trip (its code between a reply and the next command,
# its system calls and wake-ups) is in every figure.  So a one-at-a-time row's generator is
# held against the minimal client (minimal.py), both on the reference server, where the
# round trip is shortest: a generator below MIN_OF_MINIMAL (0.9x) of the minimal client's
# rate there measures itself, and its row is marked generator-bound, not a result.
# Pipelined and batch rows keep the server busy whatever the client's round trip, so their
# generator is the limit only once it runs out of CPU: one that used more than MAX_GEN_CPU
# (0.8) of a core in a run (the median of a system's runs) marks its row.  A row of many
# one-at-a-time connections is judged both ways: its client can run out of CPU too.
#
# The rules are pure functions of medians (tested as such); the tables show their verdict
# in the "result" column, in place of PASS / MISS, since a bound row passes or misses
# nothing.
from __future__ import annotations

MIN_OF_MINIMAL = 0.9        # a one-at-a-time generator's rate / the minimal client's
MAX_GEN_CPU = 0.8           # cores a pipelined or batch generator may use during a run


def share(rate: float | None, minimal_rate: float | None) -> float | None:
    """A generator's rate against the reference / the minimal client's there."""
    if rate is None or not minimal_rate:
        return None
    return rate / minimal_rate


def bound_one_at_a_time(rate: float | None, minimal_rate: float | None) -> str | None:
    """Why a one-at-a-time row is generator-bound, or None (also without figures)."""
    x = share(rate, minimal_rate)
    if x is None or x >= MIN_OF_MINIMAL:
        return None
    return f"{x:.2f}x the minimal client against the reference"


def bound_by_cpu(gen_cpu: dict[str, float | None]) -> str | None:
    """Why a pipelined or batch row is generator-bound, or None: gen_cpu maps each column
    to its generator's median CPU share (1.0 = one core) over the runs."""
    over = [(name, cpu) for name, cpu in gen_cpu.items()
            if cpu is not None and cpu > MAX_GEN_CPU]
    if not over:
        return None
    return "generator at " + ", ".join(f"{cpu:.2f} core against {name}" for name, cpu in over)


def verdict(*reasons: str | None) -> str | None:
    """The result cell of a row with these reasons (None: the row is a result)."""
    said = [r for r in reasons if r]
    return f"*generator-bound* ({'; '.join(said)}): not a result" if said else None


def ceiling_said(rate: float | None, minimal_rate: float | None) -> str | None:
    """The result cell of a generator ceiling row: its share of the minimal client, marked
    when it is below the rule's."""
    x = share(rate, minimal_rate)
    if x is None:
        return None
    return verdict(bound_one_at_a_time(rate, minimal_rate)) or \
        f"{x:.2f}x the minimal client: not the limit"
