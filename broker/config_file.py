"""The TOML config file (`zstalk serve --config zstalk.toml`): where cloud tasks call.

    [functions]
    base_url = "http://127.0.0.1:3000"   # optional: any function F is called at base_url/F
    concurrency = 1                      # defaults for every function (optional)
    timeout = "15s"
    max_timeout = "15m"
    max_result = "1MiB"                  # a bigger 2xx body fails the task (sizes: B KiB MiB)

    [functions.closeOrder]               # one table per named function (optional)
    url = "http://orders:3000/closeOrder"
    concurrency = 4
    timeout = "30s"

    [api]                                # what a request without the master key may do
    public_enqueue = false               # true: enqueue, without options
    private_results = false              # true: reading a task needs the key too
    max_body = "1MiB"                    # a bigger request body answers 413

Durations are strings with a unit (`"500ms"`, `"10s"`, `"2m"`, `"1h"`); sizes are bytes,
or strings with a binary unit (`"512KiB"`, `"4MiB"`), at most MAX_SIZE.  Everything is
checked when the file is read; a `ConfigError` names the file and the key, and nothing
is half applied.  tomllib is Python's own (3.11+).
"""
from __future__ import annotations

import re
import tomllib
from typing import Any, NamedTuple

from .core.tasks.store import FUNCTION_NAME, ApiPolicy, FunctionSpec

_DURATION = re.compile(r"\s*(\d+)\s*(ms|s|m|h)\s*")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
_DEFAULT_KEYS = {"base_url", "concurrency", "timeout", "max_timeout", "max_result"}
_SIZE = re.compile(r"\s*(\d+)\s*(B|KiB|MiB|GiB)?\s*")
_UNIT_BYTES = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
MAX_SIZE = 64 << 20         # a body or a result is held whole in memory: keep it sane
DEFAULT_SIZE = 1 << 20
_FUNCTION_KEYS = {"url", "concurrency", "timeout", "max_timeout"}


class ConfigError(Exception):
    """A config file that cannot be used, with the reason."""


class TaskConfig(NamedTuple):
    """What the config file says."""
    named: tuple[FunctionSpec, ...] = ()
    base: FunctionSpec | None = None     # the template for names under base_url
    api: ApiPolicy = ApiPolicy()
    max_result_bytes: int = DEFAULT_SIZE
    max_body_bytes: int = DEFAULT_SIZE


def load(path: str) -> TaskConfig:
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    unknown = sorted(set(doc) - {"functions", "api"})
    if unknown:
        raise ConfigError(f"{path}: unknown table [{unknown[0]}] (known: [api], [functions])")
    table = doc.get("api", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [api] must be a table")
    _no_unknown(table, {*ApiPolicy._fields, "max_body"}, f"{path}: [api]")
    flags = {k: v for k, v in table.items() if k != "max_body"}
    for key, value in flags.items():
        if type(value) is not bool:
            raise ConfigError(f"{path}: [api] {key} must be true or false")
    max_body = size_bytes(table.get("max_body", DEFAULT_SIZE), f"{path}: [api] max_body")
    return functions(doc.get("functions", {}), path)._replace(
        api=ApiPolicy(**flags), max_body_bytes=max_body)


def functions(table: Any, path: str = "config") -> TaskConfig:
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [functions] must be a table")
    defaults = {k: v for k, v in table.items() if not isinstance(v, dict)}
    _no_unknown(defaults, _DEFAULT_KEYS, f"{path}: [functions]")
    template = _spec("", {**defaults, "url": defaults.get("base_url", "http://unset")},
                     f"{path}: [functions]")
    named = []
    for name, entry in table.items():
        if not isinstance(entry, dict):
            continue
        where = f"{path}: [functions.{name}]"
        if not FUNCTION_NAME.fullmatch(name):
            raise ConfigError(f"{where}: a function name is 1 to 64 of A-Z a-z 0-9 _ . : - "
                              "(not starting with a dot)")
        _no_unknown(entry, _FUNCTION_KEYS, where)
        if "url" not in entry:
            raise ConfigError(f"{where}: url is missing")
        named.append(_spec(name, {**defaults, **entry}, where))
    base = template if "base_url" in defaults else None
    max_result = size_bytes(defaults.get("max_result", DEFAULT_SIZE),
                            f"{path}: [functions] max_result")
    return TaskConfig(tuple(named), base, max_result_bytes=max_result)


def core_fields(fns: TaskConfig | None) -> dict:
    """The broker core Config's fields for a config file read (none: no cloud tasks)."""
    if fns is None:
        return {}
    return {"functions": fns.named, "base_function": fns.base, "api": fns.api,
            "max_body_bytes": fns.max_body_bytes, "max_result_bytes": fns.max_result_bytes}


def _no_unknown(entry: dict, known: set, where: str) -> None:
    unknown = sorted(set(entry) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")


def _spec(name: str, entry: dict, where: str) -> FunctionSpec:
    url = entry["url"]
    if not isinstance(url, str) or not re.match(r"https?://[^/\s]+", url):
        raise ConfigError(f"{where}: url must be an http:// or https:// URL, not {url!r}")
    concurrency = entry.get("concurrency", 1)
    if type(concurrency) is not int or not 1 <= concurrency <= 100_000:
        raise ConfigError(f"{where}: concurrency must be an integer from 1 to 100000")
    max_timeout = duration_ms(entry.get("max_timeout", "15m"), f"{where}: max_timeout")
    timeout = duration_ms(entry.get("timeout", "15s"), f"{where}: timeout")
    if not 0 < timeout <= max_timeout:
        raise ConfigError(f"{where}: timeout must be above 0 and at most max_timeout")
    return FunctionSpec(name, url, concurrency, timeout, max(max_timeout, 1))


def duration_ms(value: Any, where: str) -> int:
    match = _DURATION.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ConfigError(f"{where}: a duration is a string with a unit: \"500ms\", \"10s\", "
                          f"\"2m\", \"1h\" (got {value!r})")
    return int(match[1]) * _UNIT_MS[match[2]]


def size_bytes(value: Any, where: str) -> int:
    match = _SIZE.fullmatch(value) if isinstance(value, str) else None
    size = value if type(value) is int else int(match[1]) * _UNIT_BYTES[match[2]] if match else None
    if size is None or not 1 <= size <= MAX_SIZE:
        raise ConfigError(f"{where}: a size is bytes or a string with a unit (\"512KiB\", "
                          f"\"4MiB\"), from 1 byte to {MAX_SIZE >> 20}MiB (got {value!r})")
    return size
