# The one table every benchmark renders: as aligned text, as Markdown, as JSON.
#
# A table has columns (the systems measured: a reference server, zstalk, zstalk at an
# --against ref...), ratio columns (num / den of two columns' medians), and rows.  A row's
# cell per column is a Figure (median, min-max, n); a row may carry a target on a ratio
# or on a column's median, and then says PASS or MISS, unless its result is given: a row
# marked generator-bound (ceiling.py) says so instead.  The same rows give all three
# renderings, so the terminal, the manual and the JSON never disagree.
from __future__ import annotations

from .stats import Figure, is_number

RATIO_FMT = "{:.2f}x"


class Table:
    def __init__(self, name: str, title: str, columns: list[tuple[str, str]],
                 ratios=(), note: str = "") -> None:
        """columns: (key, header); ratios: (num key, den key[, header])."""
        self.name, self.title, self.note = name, title, note
        self.columns = list(columns)
        heads = dict(self.columns)
        self.ratios = [(r[0], r[1], r[2] if len(r) > 2 else f"{heads[r[0]]}/{heads[r[1]]}")
                       for r in ratios if r[0] in heads and r[1] in heads]
        self.rows: list[dict] = []

    def add(self, metric: str, cells: dict, fmt: str = "{:,.0f}", target=None,
            ratio: bool = True, result: str | None = None) -> None:
        """cells: column key -> Figure, a list of samples, or one number.  target:
        (ratio header or column key, ">=" or "<=", threshold[, how to say it]), or a list
        of them, all to be met.  result: what the result column says, judged or not."""
        figs = {k: v if isinstance(v, Figure) else Figure(v if isinstance(v, list) else [v])
                for k, v in cells.items()}
        ratios = {}
        for num, den, head in self.ratios:
            a, b = figs.get(num, Figure()).median, figs.get(den, Figure()).median
            ratios[head] = a / b if ratio and is_number(a) and b else None
        row = dict(metric=metric, cells=figs, ratios=ratios, fmt=fmt, target="", result="")
        if target:
            self._judge(row, target if isinstance(target, list) else [target])
        if result:
            row["result"] = result
        self.rows.append(row)

    def _judge(self, row: dict, targets: list[tuple]) -> None:
        said, missed, known = [], [], 0
        for which, op, thr, *say in targets:
            if which in row["ratios"]:
                value, what = row["ratios"][which], f"{which} {op} {thr}x"
            else:
                value = row["cells"].get(which, Figure()).median
                what = f"{dict(self.columns).get(which, which)} {op} {thr}"
            said.append(say[0] if say else what)
            if value is not None:
                known += 1
                if not (value >= thr if op == ">=" else value <= thr):
                    missed.append(said[-1])
        row["target"] = ", ".join(said)
        row["result"] = ("MISS (no data)" if not known else
                         "MISS" if missed and len(targets) == 1 else
                         f"MISS ({', '.join(missed)})" if missed else
                         "PASS" if known == len(targets) else "PASS (part)")

    # ----------------------------------------------------------------------- rendering
    def _grid(self) -> tuple[list[str], list[list[str]], set[int]]:
        judged = any(r["target"] or r["result"] for r in self.rows)
        header = ["metric"] + [h for _, h in self.columns] + [h for *_, h in self.ratios]
        header += ["target", "result"] if judged else []
        body = []
        for r in self.rows:
            cells = [r["metric"]] + [r["cells"].get(k, Figure()).text(r["fmt"])
                                     for k, _ in self.columns]
            cells += ["-" if v is None else RATIO_FMT.format(v) for v in r["ratios"].values()]
            body.append(cells + ([r["target"], r["result"]] if judged else []))
        right = set(range(1, 1 + len(self.columns) + len(self.ratios)))
        return header, body, right

    def text(self) -> str:
        header, body, right = self._grid()
        widths = [max(len(row[i]) for row in [header] + body) for i in range(len(header))]

        def line(cells):
            return "  ".join(c.rjust(widths[i]) if i in right else c.ljust(widths[i])
                             for i, c in enumerate(cells)).rstrip()
        return "\n".join([self.title] + ([self.note] if self.note else [])
                         + [line(header), line(["-" * w for w in widths])]
                         + [line(b) for b in body])

    def markdown(self) -> str:
        header, body, right = self._grid()
        esc = lambda c: c.replace("|", "\\|")                       # noqa: E731
        lines = ["| " + " | ".join(map(esc, header)) + " |",
                 "|" + "|".join("---:" if i in right else "---" for i in range(len(header)))
                 + "|"]
        return "\n".join(lines + ["| " + " | ".join(map(esc, b)) + " |" for b in body])

    def as_json(self) -> dict:
        return dict(name=self.name, title=self.title, note=self.note,
                    columns=[dict(key=k, header=h) for k, h in self.columns],
                    ratios=[dict(num=n, den=d, header=h) for n, d, h in self.ratios],
                    rows=[dict(metric=r["metric"], target=r["target"], result=r["result"],
                               ratios=r["ratios"],
                               cells={k: dict(f.as_json(), text=f.text(r["fmt"]))
                                      for k, f in r["cells"].items()}) for r in self.rows],
                    markdown=self.markdown(), text=self.text())


def cpu_shares(results: dict, keys=("gen_cpu_share", "server_cpu_share")) -> str:
    """The generator check: for every list of runs in the raw results, the range of each
    CPU share (cpu s / wall s; 1.00 = one full core), one line per row and variant."""
    lines = []

    def walk(node, path):
        if isinstance(node, dict):
            systems = {k: v for k, v in node.items() if _runs(v)}
            if systems:
                parts = []
                for name, runs in systems.items():
                    ranges = [_range(runs, k) for k in keys]
                    parts.append(f"{name}: " + ", ".join(
                        f"{k.split('_cpu')[0]} {r}" for k, r in zip(keys, ranges) if r))
                lines.append(f"  {' '.join(path)}: " + "; ".join(parts))
            for k, v in node.items():
                if k not in systems:
                    walk(v, path + [str(k)])
    walk(results, [])
    return "\n".join(["CPU check (cpu s / wall s, min-max of the runs; 1.00 = one core):"]
                     + lines) if lines else ""


def _runs(v) -> bool:
    return isinstance(v, list) and any(isinstance(r, dict) and "gen_cpu_share" in r
                                       or isinstance(r, dict) and "server_cpu_share" in r
                                       for r in v)


def _range(runs: list, key: str) -> str:
    v = [r[key] for r in runs if isinstance(r, dict) and is_number(r.get(key))]
    return f"{min(v):.2f}-{max(v):.2f}" if v else ""
