"""The journal's stream on NATS JetStream: the options, the connection, the stream's
settings checked (or the stream made), and the replay that reads it back (an ordered
consumer folding each message into fold.py's Fold, from the stream's first message or
on from a warm standby's, follow.py).  jetstream.py owns what is appended when; this
module what a start finds and refuses.

Names: the stream `ZSTALK_<name>` holds the subject `zstalk.<name>.journal` (`--journal-name`,
default `zstalk`).  One message is one append of the broker: a binlog frame (format.py's
`encode_frame`: length, crc32, the records as the binlog writes them) and headers:

    Nats-Msg-Id                  <writer>-<sequence>: a retried append is recognised (dedup)
    Nats-Expected-Last-Sequence  the sequence the writer believes is last: fencing
    Zstalk-State                 the state id (fronts' re-registered sessions keep theirs)
    Zstalk-Next-Id               the next job id when it was appended (ids never go back)
    Zstalk-Gates                 the slow rates' TATs, JSON, when they moved (a GATES record)
    Zstalk-Epoch                 the lease's epoch the writer leads under (lease.py)
    Zstalk-Leader                on the EPOCH message only: the instance that took over

The EPOCH message (no records, those two headers) is what a new leader appends at
takeover, right after the last sequence it read: the fencing point (jetstream.py).

The settings a stream must have (issue 42; a stream made here has them): file storage,
replicas 3 (1 allowed with a warning: a local try), limits retention, discard new (with
`old`, or a max_age, NATS drops the oldest records silently: data loss), no message
limit, deny_delete, a duplicate window of at least 2 minutes (the retry of an append
whose acknowledgement was lost is recognised only inside it), and a max_msg_size that
takes the largest record.  A setting that differs is refused naming it (exit 2);
`sync_interval: always` is server config, seen only through the monitoring endpoint
(`--journal-monitor`), else the start line says it is not verified.

nats is imported only here and in jetstream.py, and only with --journal: a server without
one never loads it.
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import re
import urllib.parse
from typing import Callable, NamedTuple

from . import format as wf
from . import fold as fold_
from .fold import Corrupt, Fold, Read, Span, headers_size as _headers_size  # noqa: F401

log = logging.getLogger("zstalk.journal")

NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: the least duplicate window: a retry of an append whose acknowledgement was lost must
#: come within it (appends are retried for at most --journal-timeout, 30 s by default)
MIN_DUPLICATE_WINDOW_S = 120.0
#: what a message carries beyond its records: the frame header, and headers (generous)
MESSAGE_OVERHEAD = wf.FRAME.size + 1024
H_ID, H_EXPECT = "Nats-Msg-Id", "Nats-Expected-Last-Sequence"
H_STATE, H_NEXT, H_GATES = fold_.H_STATE, fold_.H_NEXT, fold_.H_GATES
H_EPOCH, H_LEADER = "Zstalk-Epoch", "Zstalk-Leader"
#: JetStream's refusal of an append whose Nats-Expected-Last-Sequence is not the last
WRONG_SEQUENCE = 10071
#: refusals that mean the stream cannot take the append, now or later (full, too big)
CANNOT_STORE = {10077: "the stream is full (max_bytes)",
                10047: "NATS has no storage left (insufficient storage resources)",
                10054: "a message above the stream's max_msg_size",
                10028: "NATS has no memory left (insufficient memory resources)"}
#: after a refusal that may pass (no responders while NATS elects), the wait to try again
RETRY_S = 0.25
#: how long one request for the stream's info, or for a consumer to read it with, waits: while
#: NATS elects the stream's leader it may go unanswered, and it is asked again (until
#: --journal-timeout) rather than waited on
ASK_S = 2.0
#: exit codes: a journal that cannot be used at start (as a binlog directory, beanstalkd's
#: 10), refused settings (2, a usage error), deposed by another writer, NATS gone too long
UNUSABLE_EXIT, SETTINGS_EXIT, DEPOSED_EXIT, UNAVAILABLE_EXIT = 10, 2, 12, 13


class JournalError(Exception):
    """The journal cannot be used: exit with `code` (UNUSABLE_EXIT unless said)."""

    def __init__(self, message: str, code: int = UNUSABLE_EXIT) -> None:
        super().__init__(message)
        self.code = code


class Options(NamedTuple):
    urls: tuple[str, ...]               # nats://H:P of each server
    name: str = "zstalk"
    creds: str | None = None            # --journal-creds FILE (a NATS .creds file)
    user: str | None = None             # or a user and password (--journal-user-file)
    password: str | None = None
    user_file: str | None = None        # (where they were read: a supervised child reads it)
    tls_ca: str | None = None           # --journal-tls-ca FILE
    timeout_s: float = 30.0             # --journal-timeout: no acknowledged append for this long
    replicas: int = 3                   # --journal-replicas (1: a local try)
    monitor: tuple[str, ...] = ()       # --journal-monitor URLs (sync_interval checked there)
    # appends in flight at most: 2 measured better than 4 on every count (bench_journal
    # --against, 8 x 32 pipelined, 5 runs: 1.08x the puts/s, broker CPU per put 0.87x,
    # NATS's 0.78x, p99 9.6 against 11.8 ms): fewer, larger appends
    inflight: int = 2
    lease_s: float = 1.5                # --journal-lease-ms: a standby claims a lease this still
    stall_s: float = 5.0                # --journal-stall-ms: the leader stops renewing the lease
                                        # once its loop has not turned for this long (0: never)
    advertise: str = ""                 # --advertise: where this instance is reached (the lease)
    epoch: int = 0                      # the lease's epoch this instance leads under (0: none)
    instance: str = ""                  # this instance's id in the lease and its appends' ids
    # a warm standby's takeover: called once, it stops following and gives the Fold it
    # kept (follow.py), or None; the restore then reads only the stream's tail after it
    warm: Callable[[], Fold | None] | None = None

    @property
    def stream(self) -> str:
        return f"ZSTALK_{self.name}"

    @property
    def subject(self) -> str:
        return f"zstalk.{self.name}.journal"

    def said(self) -> str:
        return f"journal {','.join(self.urls)} stream {self.stream}"


def parse_urls(spec: str) -> tuple[str, ...]:
    """--journal's value: nats://H:P[,H:P…] (a bare H:P is taken as nats://); raises
    ValueError naming what is wrong."""
    urls = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if "://" not in part:
            part = "nats://" + part
        u = urllib.parse.urlsplit(part)
        if u.scheme not in ("nats", "tls") or not u.hostname:
            raise ValueError(f"{part!r} is not nats://HOST:PORT")
        try:
            u.port
        except ValueError:
            raise ValueError(f"{part!r}: the port is not a number from 0 to 65535") from None
        urls.append(part)
    if not urls:
        raise ValueError("no NATS URL given (nats://HOST:PORT[,HOST:PORT…])")
    return tuple(urls)


def loopback_only(urls) -> bool:
    """Whether every URL names this machine (a NATS elsewhere needs credentials)."""
    for url in urls:
        host = urllib.parse.urlsplit(url).hostname or ""
        if host == "localhost":
            continue
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return False
        except ValueError:
            return False
    return True


# -- connecting -------------------------------------------------------------------------------
async def connect(opts: Options, retry: bool = False, **callbacks):
    """A NATS connection to any of opts.urls, reconnecting for ever once made; without
    `retry` each server is tried twice and JournalError names them all if none answers
    (a start), with it the first connect tries for ever too (the actor's loop: the
    journal's timeout decides)."""
    import nats
    kwargs: dict = dict(servers=list(opts.urls), name="zstalk-broker", connect_timeout=2,
                        reconnect_time_wait=0.25, allow_reconnect=True, ping_interval=5,
                        max_outstanding_pings=2, max_reconnect_attempts=-1 if retry else 1)
    if opts.creds:
        kwargs["user_credentials"] = opts.creds
    if opts.user:
        kwargs["user"], kwargs["password"] = opts.user, opts.password or ""
    if opts.tls_ca:
        import ssl
        kwargs["tls"] = ssl.create_default_context(cafile=opts.tls_ca)
    failed: list[str] = []

    async def said(exc) -> None:          # (nats-py reports each failed try here; the
        failed[:] = [str(exc) or type(exc).__name__]    # last kept: a lease's lasts)
    callbacks.setdefault("error_cb", said)
    try:
        nc = await nats.connect(**kwargs, **callbacks)
    except Exception as exc:
        why = failed[-1] if failed else (str(exc) or type(exc).__name__)
        raise JournalError(f"cannot reach NATS at {', '.join(opts.urls)}: {why}") from None
    nc.options["max_reconnect_attempts"] = -1       # (once made: reconnect for ever)
    return nc


# -- the stream's settings ---------------------------------------------------------------------
def wanted_config(opts: Options, max_msg_size: int):
    from nats.js import api
    return api.StreamConfig(
        name=opts.stream, subjects=[opts.subject], storage=api.StorageType.FILE,
        num_replicas=opts.replicas, retention=api.RetentionPolicy.LIMITS,
        discard=api.DiscardPolicy.NEW, max_age=0, max_msgs=-1, max_msgs_per_subject=-1,
        deny_delete=True, deny_purge=False, duplicate_window=MIN_DUPLICATE_WINDOW_S,
        description="zstalk's journal (do not change: zstalk refuses a stream that can "
                    "lose records)")


def refusals(config, opts: Options, need_msg_size: int) -> list[str]:
    """What in an existing stream's config would lose records or cannot carry them."""
    def value(v):
        return getattr(v, "value", v)
    out = []
    if value(config.storage) != "file":
        out.append(f"storage is {value(config.storage)}, not file")
    if config.num_replicas not in (opts.replicas, None):
        out.append(f"replicas is {config.num_replicas}, not {opts.replicas} "
                   f"(--journal-replicas)")
    if value(config.retention) != "limits":
        out.append(f"retention is {value(config.retention)}, not limits")
    if value(config.discard) != "new":
        out.append(f"discard is {value(config.discard)}, not new (NATS would drop the "
                   f"oldest records)")
    if config.max_age:
        out.append(f"max_age is {config.max_age:g} s, not 0 (NATS would drop records "
                   f"older than that)")
    for field in ("max_msgs", "max_msgs_per_subject"):
        limit = getattr(config, field)
        if limit not in (None, -1, 0):
            out.append(f"{field} is {limit}, not unlimited")
    if not config.deny_delete:
        out.append("deny_delete is false, not true")
    if config.deny_purge:
        out.append("deny_purge is true: compaction purges the records it copied forward")
    if (config.duplicate_window or 0) < MIN_DUPLICATE_WINDOW_S:
        out.append(f"duplicate_window is {config.duplicate_window or 0:g} s, below "
                   f"{MIN_DUPLICATE_WINDOW_S:g} s (a retried append would not be recognised)")
    if config.max_msg_size not in (None, -1, 0) and config.max_msg_size < need_msg_size:
        out.append(f"max_msg_size is {config.max_msg_size}, below the {need_msg_size} bytes "
                   f"a message of the largest record needs (-z)")
    if config.subjects and opts.subject not in config.subjects:
        out.append(f"subjects are {config.subjects}, without {opts.subject}")
    return out


async def open_stream(nc, opts: Options, max_job_size: int, warn: bool = True):
    """The stream's info, the stream made if missing; JournalError (exit 2) naming a
    setting that would lose records or a -z a message cannot carry; `warn`: say what
    is allowed but amiss (once a start: the lease's check does not)."""
    from nats.js.errors import NotFoundError
    need = max_message(max_job_size)
    if need > nc.max_payload:
        raise JournalError(f"-z {max_job_size}: a job that size needs a message of {need} "
                           f"bytes, above NATS's max_payload of {nc.max_payload}; lower -z or "
                           f"raise max_payload in the NATS servers' config", SETTINGS_EXIT)
    js = nc.jetstream(timeout=10)
    asking = nc.jetstream(timeout=ASK_S)

    async def stream_info():
        try:
            return await asking.stream_info(opts.stream)
        except NotFoundError:
            return None
    info = await once_elected(opts, f"cannot read stream {opts.stream}", stream_info)
    if info is None:
        info = await _make(js, opts, need)
        log.info("journal: made stream %s (%d replicas, file storage, discard new)",
                 opts.stream, opts.replicas)
    wrong = refusals(info.config, opts, need)
    if wrong:
        raise JournalError(f"stream {opts.stream} would lose records or cannot carry them: "
                           f"{'; '.join(wrong)}", SETTINGS_EXIT)
    if opts.replicas == 1 and warn:
        log.warning("journal: stream %s has 1 replica: a local try, not high availability "
                    "(--journal-replicas 3)", opts.stream)
    return info


async def once_elected(opts: Options, what: str, ask):
    """`await ask()`, asked again while NATS does not answer as it elects the stream's
    leader (its node died, maybe with the broker's machine), for --journal-timeout, as an
    append is; then, or on another refusal, JournalError saying `what`."""
    loop = asyncio.get_running_loop()
    until = loop.time() + opts.timeout_s
    while True:
        try:
            return await ask()
        except Exception as exc:
            if not _electing(exc) or loop.time() > until:
                raise JournalError(f"NATS at {', '.join(opts.urls)}: {what}: {exc}") from None
            log.info("journal: %s (%s): NATS may be electing the stream's leader; trying "
                     "again", what, exc or type(exc).__name__)
            await asyncio.sleep(RETRY_S)


def _electing(exc: BaseException) -> bool:
    """Whether a refusal may pass once NATS has a stream leader: a timeout, no
    responders (503), JetStream not ready or a stream without a leader yet."""
    return isinstance(exc, (asyncio.TimeoutError, TimeoutError)) or \
        type(exc).__name__ in ("NoRespondersError", "TimeoutError") or \
        getattr(exc, "code", None) == 503 or getattr(exc, "err_code", None) in (10008, 10074)


async def _make(js, opts: Options, need: int, wait_s: float = 15.0):
    """The stream made; a cluster still forming ('no suitable peers', no JetStream
    leader yet) is given `wait_s` to form."""
    loop = asyncio.get_running_loop()
    until = loop.time() + wait_s
    while True:
        try:
            return await js.add_stream(wanted_config(opts, need))
        except Exception as exc:
            forming = getattr(exc, "err_code", None) in (10005, 10008) or \
                getattr(exc, "code", None) == 503 or isinstance(exc, asyncio.TimeoutError)
            if not forming or loop.time() > until:
                raise JournalError(f"NATS at {', '.join(opts.urls)}: cannot make stream "
                                   f"{opts.stream} ({opts.replicas} replicas): {exc}") from None
            await asyncio.sleep(0.25)


def max_message(max_job_size: int) -> int:
    """The largest message one job needs: its JOB record (a tube name of 200 bytes, -z of
    body) in a frame, with the headers."""
    return wf.JOB_FIXED_SIZE + 200 + max_job_size + MESSAGE_OVERHEAD


def sync_checked(opts: Options, taking_over: bool = False) -> str:
    """The start line's word on `sync_interval: always`: verified through each
    --journal-monitor's /varz that answers, or said not to be (JournalError, exit 2, if
    one says otherwise).  A monitor that does not answer is skipped with a warning: a
    NATS node may be down, the more so at a takeover, when it may have gone with the
    leader's machine.  None answering refuses a first start (the setting could not be
    checked at all) but not a takeover, which must not wait on a lost node."""
    if not opts.monitor:
        return "sync_interval not verified (--journal-monitor)"
    import urllib.request       # (only now: it loads http.client and email, ~10 ms)
    answered = []
    for url in opts.monitor:
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/varz", timeout=3) as r:
                varz = json.load(r)
        except (OSError, ValueError) as exc:
            log.warning("journal: --journal-monitor %s did not answer (%s): skipped", url, exc)
            continue
        js = varz.get("jetstream", {}).get("config", {})
        if not js.get("sync_always"):
            raise JournalError(f"--journal-monitor {url}: the server does not fsync every "
                               f"write (sync_interval is not 'always'): NATS can lose "
                               f"acknowledged records in a crash", SETTINGS_EXIT)
        answered.append(url)
    if answered:
        return "sync_interval always" + (
            "" if len(answered) == len(opts.monitor) else
            f" (on {len(answered)} of {len(opts.monitor)} monitors that answered)")
    if not taking_over:
        raise JournalError(f"--journal-monitor: none of {', '.join(opts.monitor)} answered: "
                           f"sync_interval cannot be verified")
    return "sync_interval not verified (no --journal-monitor answered at the takeover)"


# -- reading it back ---------------------------------------------------------------------------
#: the ordered consumer's idle heartbeat: two missed (a NATS node gone with the consumer)
#: and nats-py makes it again from the next sequence
HEARTBEAT_S = 2.0
#: what a consumer may have delivered and not yet been folded, at most (flow control
#: keeps it far below: the server waits for the client's answer)
PENDING_BYTES = 64 * 1024 * 1024
#: the reads of a stream that compaction purged under them, at most
READS = 3


def continues(fold: Fold, info) -> bool:
    """Whether `fold` can go on with the stream `info` describes: nothing it still needs
    was purged, and the stream is not shorter than what it applied (made again)."""
    if not fold.last_seq:
        return True
    return info.state.first_seq <= fold.last_seq + 1 <= info.state.last_seq + 1


async def subscribe(nc, opts: Options, start_seq: int, ask_s: float = 10.0):
    """An ordered consumer of the journal from message `start_seq` (1 or less: its first):
    what nats-py's KV watch and object store read with, one ephemeral R1 consumer in
    memory, no acknowledgements, flow control, and made again from the next sequence when
    its heartbeats stop (its NATS node gone).  Making it waits `ask_s` for NATS's answer."""
    from nats.js import api
    js = nc.jetstream(timeout=ask_s)
    if start_seq > 1:
        return await js.subscribe(
            opts.subject, ordered_consumer=True, stream=opts.stream,
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
            config=api.ConsumerConfig(opt_start_seq=start_seq), idle_heartbeat=HEARTBEAT_S,
            pending_bytes_limit=PENDING_BYTES)
    return await js.subscribe(opts.subject, ordered_consumer=True, stream=opts.stream,
                              deliver_policy=api.DeliverPolicy.ALL,
                              idle_heartbeat=HEARTBEAT_S, pending_bytes_limit=PENDING_BYTES)


def apply(fold: Fold, msg) -> None:
    """Fold one message in; JournalError if it fails its checksum."""
    try:
        fold.apply(msg.metadata.sequence.stream, msg.headers, msg.data)
    except Corrupt as exc:
        raise JournalError(str(exc)) from None


async def read(nc, opts: Options, info, max_job_size: int, fold: Fold | None = None) -> Read:
    """Replay the stream to the last message it had when asked (`info`): from its first
    message, or on from `fold`'s last (a warm standby's, follow.py; a read's own, when a
    takeover's EPOCH was beaten).  A fold whose next message was purged is dropped for a
    new one, from the stream's first message."""
    for _ in range(READS):
        if fold is None or not continues(fold, info):
            if fold is not None:
                log.info("journal: messages after %d were purged: reading the stream from "
                         "its first", fold.last_seq)
            fold = Fold()
        if await _read_to(nc, opts, fold, info.state.last_seq):
            return fold.read()
        fold = None                     # (purged while we read: again from the start)
        info = await nc.jetstream(timeout=10).stream_info(opts.stream)
    raise JournalError(f"stream {opts.stream}: purged under every one of {READS} reads")


async def _read_to(nc, opts: Options, fold: Fold, last: int) -> bool:
    """Fold messages in up to `last`; False when the next one was purged meanwhile."""
    if fold.last_seq >= last:
        return True
    # (a takeover right after the leader's machine took its stream's NATS leader with it
    # finds the stream's info answered before a consumer can be made: a warm standby a few
    # messages behind died of that request's timeout instead of leading, seen in
    # tests/ha/test_kill_campaigns.py; so it is asked again while NATS elects)
    start = fold.last_seq + 1
    sub = await once_elected(opts, f"cannot read stream {opts.stream} from sequence {start}",
                             lambda: subscribe(nc, opts, start, ASK_S))
    try:
        while fold.last_seq < last:
            msg = await asyncio.wait_for(sub.next_msg(timeout=None), 30)
            if not fold.expects(msg.metadata.sequence.stream):
                return False
            apply(fold, msg)
    except (asyncio.TimeoutError, TimeoutError):
        raise JournalError(f"stream {opts.stream}: reading it back stalled before "
                           f"sequence {last}") from None
    finally:
        await sub.unsubscribe()
    return True


def run_on_a_loop_of_its_own(coro, timeout_s: float | None = None):
    """Run `coro` to its end on a new asyncio loop (the start, before the actor's loop
    runs; on a thread if this one already runs a loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(asyncio.wait_for(coro, timeout_s))
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, asyncio.wait_for(coro, timeout_s)).result()
