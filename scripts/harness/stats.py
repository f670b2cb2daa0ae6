# Figures from repeated runs, and the order the runs are made in.
#
# A Figure is the samples of one row for one system: the median is the figure, min-max
# its spread, n the number of runs.  The median, not the best run: on a shared machine a
# best run is a lucky one, and two tables' best runs differ by luck; the spread says how
# much the runs disagreed.
#
# rounds() gives the order of runs: every repetition runs each system once, the order
# reversed every other repetition (a, b, c then c, b, a), so a slow phase of the machine
# falls on all systems alike; warm-up rounds come first and are flagged, their samples
# are dropped.
from __future__ import annotations

import math


def median(values) -> float | None:
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def pct(values, p: float) -> float:
    """Nearest-rank percentile p (0-100) of the values; nan for none."""
    v = sorted(values)
    if not v:
        return float("nan")
    return v[max(0, min(len(v) - 1, math.ceil(p / 100.0 * len(v)) - 1))]


def hist_pct(hist: dict, p: float, unit: float = 1.0) -> float | None:
    """Nearest-rank percentile p (0-100) of a histogram {bucket: count}, as bucket x unit
    (the bucket's lower bound); None for an empty one."""
    total = sum(hist.values())
    if not total:
        return None
    rank, seen = max(1, math.ceil(p / 100.0 * total)), 0
    for bucket in sorted(hist):
        seen += hist[bucket]
        if seen >= rank:
            return bucket * unit
    return max(hist) * unit


def per_1k(cpu_s: float | None, count: float | None) -> float | None:
    """CPU-seconds per 1,000 operations."""
    return cpu_s / count * 1000.0 if cpu_s is not None and count else None


def paired(runs: list[dict], base: list[dict], key: str) -> list[float]:
    """Each run's `key` / the base run's of the same repetition (both lists in the order
    the repetitions ran: the two runs of a pair ran side by side), where both have it;
    none when the lists differ in length (a run was aborted: the pairs would not match)."""
    if len(runs) != len(base):
        return []
    return [x[key] / y[key] for x, y in zip(runs, base)
            if is_number(x.get(key)) and is_number(y.get(key)) and y[key]]


def ratios_text(ratios: list[float]) -> str:
    """"1.012, 0.987, 1.003 (median 1.003)": paired ratios with their median."""
    return ", ".join(f"{r:.3f}" for r in ratios) + f" (median {median(ratios):.3f})"


def is_number(x) -> bool:
    return isinstance(x, (int, float)) and not (isinstance(x, float) and math.isnan(x))


class Figure:
    """The samples of one row for one system: median, min-max, n."""

    def __init__(self, samples=()) -> None:
        self.samples = [x for x in samples if is_number(x)]

    @classmethod
    def of(cls, runs: list[dict] | None, key: str) -> "Figure":
        """The figure of `key` over a list of per-run result dicts."""
        return cls(r.get(key) for r in runs or () if isinstance(r, dict))

    @property
    def median(self) -> float | None:
        return median(self.samples)

    @property
    def lo(self) -> float | None:
        return min(self.samples) if self.samples else None

    @property
    def hi(self) -> float | None:
        return max(self.samples) if self.samples else None

    @property
    def n(self) -> int:
        return len(self.samples)

    def text(self, fmt: str) -> str:
        """"216,109 (205,311–220,456)"; one sample: the value alone; none: "-"."""
        if not self.samples:
            return "-"
        if self.n == 1 or self.lo == self.hi:
            return fmt.format(self.median)
        return f"{fmt.format(self.median)} ({fmt.format(self.lo)}–{fmt.format(self.hi)})"

    def as_json(self) -> dict:
        return dict(median=self.median, min=self.lo, max=self.hi, n=self.n,
                    samples=self.samples)


def rounds(systems: list, repeats: int, warmup: int = 0):
    """(repetition, order, is_warm_up) for warm-up rounds, then the measured ones."""
    for r in range(warmup + repeats):
        order = list(systems) if (r - warmup) % 2 == 0 else list(systems)[::-1]
        yield r - warmup, order, r < warmup
