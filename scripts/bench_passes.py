#!/usr/bin/env python3
"""Benchmark the waiting room's pass check: verifies per second on one core (issue 31).

Usage:
    .venv/bin/python scripts/bench_passes.py [--quick] [--repeats N] [--count N] [--json PATH]

Target (the issue): >= 5,000 verifies/s per front process.

Method
------
One thread in this process, pinned to one CPU (the first this process may use) where the
platform allows.  Passes are signed beforehand with a two-key PassKeys (the signing key
first, a 44-character key as `openssl rand -base64 32` writes), for a 32-hex-digit task id
(what the front makes for online tasks) and a 20-character function; each verifies at a
fixed `now` before its expiry, so every call runs the whole check (syntax, key, MAC,
expiry, function) and succeeds.  --count (200,000; 20,000 --quick) calls per repetition
over 1,000 different passes in turn, best of --repeats (5; 3 --quick), so a
neighbour's burst on a shared machine shows as a slow repetition, not a slow figure.
Rows:
* `codec`: zstalk.protocol.codecs.passes.verify_pass(token, keys, now, function);
* `sdk, PassKeys`: zstalk.workers.verify_pass(token, keys, function, now);
* `sdk, key file`: the same with the key file's path (one stat per call, read once);
* `verify endpoint`: protocol/fronts/pass_check.check_request on the request's headers
  (a CIMultiDict as aiohttp gives) and query, the pure part of GET /v1/passes/verify
  without the HTTP server or the broker's revocation answer.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from typing import Callable

from multidict import CIMultiDict

from zstalk.protocol.codecs import passes as codec
from zstalk.protocol.fronts.pass_check import check_request
from zstalk.workers import verify_pass

TARGET = 5_000
NOW = 1_700_000_000
FUNCTION = "checkout-flash-sale1"
KEYS = codec.PassKeys([("k2", "K8Yp3Zl0vX6m4QnRw1tJb9cUe2hFg7iDs5aLk0oNq3E="),
                       ("k1", "b4T1Vq8Xy2Wz6Nc0Mk3Lj7Hg5Fd9Sa1Po4Iu8Yt2Re6=")])


def passes(n: int = 1000) -> list[str]:
    return [codec.sign_pass(KEYS, f"{i:032x}", FUNCTION, NOW + 300) for i in range(n)]


def rate(call: Callable[[str], object], tokens: list[str], count: int, repeats: int) -> float:
    """Best verifies/s of `repeats` runs of `count` calls."""
    best = 0.0
    loops, rest = divmod(count, len(tokens))
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(loops):
            for token in tokens:
                call(token)
        for token in tokens[:rest]:
            call(token)
        best = max(best, count / (time.perf_counter() - start))
    return best


def rows(key_file: str) -> dict[str, Callable[[str], object]]:
    query = {"function": FUNCTION}
    return {
        "codec": lambda t: codec.verify_pass(t, KEYS, NOW, FUNCTION),
        "sdk, PassKeys": lambda t: verify_pass(t, KEYS, FUNCTION, NOW),
        "sdk, key file": lambda t: verify_pass(t, key_file, FUNCTION, NOW),
        "verify endpoint": lambda t: check_request(
            CIMultiDict({"Host": "api", "Authorization": f"Bearer {t}"}), query, KEYS, NOW),
    }


def pin_one_cpu() -> str:
    if not hasattr(os, "sched_setaffinity"):
        return "not pinned"
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return f"CPU {cpu}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--count", type=int)
    ap.add_argument("--json")
    args = ap.parse_args()
    count = args.count or (20_000 if args.quick else 200_000)
    repeats = args.repeats or (3 if args.quick else 5)
    cpu, tokens = pin_one_cpu(), passes()
    with tempfile.TemporaryDirectory() as tmp:
        key_file = os.path.join(tmp, "pass-keys")
        with open(key_file, "w") as f:
            f.write("".join(f"{kid}:{key.decode()}\n" for kid, key in KEYS.items()))
        results = {name: rate(call, tokens, count, repeats) for name, call in rows(key_file).items()}
    print(f"pass verifies/s, one thread on {cpu}, Python {platform.python_version()}, "
          f"best of {repeats} x {count:,}")
    print("| check | verifies/s | µs each | vs target 5,000/s |\n|---|---:|---:|---:|")
    for name, per_s in results.items():
        print(f"| {name} | {per_s:,.0f} | {1e6 / per_s:.2f} | {per_s / TARGET:.0f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu, "count": count, "repeats": repeats, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
