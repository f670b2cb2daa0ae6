# The floor of the one-at-a-time rows: the least a Python server on uvloop does per command.
# A bare asyncio.Protocol on uvloop (what zstalk runs on) that keeps no state but a counter
# and answers every command with a canned reply, all the replies to one read in one
# transport.write(); the benchmarks drive it with the same minimal client as the servers
# (minimal.py), so a row's "floor" is what the event loop and the interpreter allow, and
# zstalk's distance from it is its own work.  Run as a process of its own, with the
# python of a venv that has uvloop: `python scripts/harness/floor_server.py --port P
# [--protocol beanstalk | counter]`; floor() gives the command line.
#
# beanstalk: a line is cut at its CRLF (a put's also waits for its <bytes> body and CRLF,
# beanstalkd's doc/protocol.txt); put -> `INSERTED <n>` (n counting up), reserve ->
# `RESERVED <n> 100` + a 100-byte body (the benchmarks' body), delete <id> -> `DELETED`,
# list-tube-used -> `USING default` (the harness's readiness probe), quit closes, anything
# else -> `UNKNOWN_COMMAND`.  counter: yrmcds' binary frames (12-byte header, body length at
# bytes 4-8); each request gets a response with magic 0x91, the request's opcode and opaque,
# status 0, and a body of 4 bytes (the count, 1) for Get and Acquire, none otherwise.
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import struct
import sys

BODY = (b"0123456789abcdefghijklmnopqrstuvwxyz" * 3)[:100]      # the benchmarks' body
RESERVED = b"RESERVED %d " + b"%d\r\n" % len(BODY) + BODY + b"\r\n"
HEADER = struct.Struct(">BBBBII")
WITH_COUNT = {0x01, 0x02}       # Get, Acquire: a 4-byte count in the response


class Beanstalk(asyncio.Protocol):
    def connection_made(self, transport) -> None:
        self.transport, self.buf, self.jobs = transport, bytearray(), 0

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        out, pos = [], 0
        while True:
            i = buf.find(b"\r\n", pos)
            if i < 0:
                break
            reply, end = self.answer(buf, pos, i)
            if end is None:
                break                     # a put's body is not all in yet
            if reply is None:
                self.transport.close()
                return
            out.append(reply)
            pos = end
        del buf[:pos]
        if out:
            self.transport.write(b"".join(out))

    def answer(self, buf: bytearray, pos: int, i: int):
        """(the reply to the line at buf[pos:i], where the next command starts); (None, end)
        for quit; (_, None) while a put's body is still to come."""
        if buf.startswith(b"put ", pos):
            end = i + 4 + int(buf[pos:i].rsplit(b" ", 1)[1])
            if len(buf) < end:
                return None, None
            self.jobs += 1
            return b"INSERTED %d\r\n" % self.jobs, end
        line = bytes(buf[pos:i])
        if line == b"reserve" or line.startswith(b"reserve-with-timeout "):
            self.jobs += 1
            return RESERVED % self.jobs, i + 2
        if line.startswith(b"delete "):
            return b"DELETED\r\n", i + 2
        if line == b"list-tube-used":
            return b"USING default\r\n", i + 2
        if line == b"quit":
            return None, i + 2
        return b"UNKNOWN_COMMAND\r\n", i + 2


class Counter(asyncio.Protocol):
    def connection_made(self, transport) -> None:
        self.transport, self.buf = transport, bytearray()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        out, pos = [], 0
        while len(buf) >= pos + 12:
            _magic, opcode, _flags, _res, length, opaque = HEADER.unpack_from(buf, pos)
            if len(buf) < pos + 12 + length:
                break
            body = b"\0\0\0\1" if opcode in WITH_COUNT else b""
            out.append(HEADER.pack(0x91, opcode, 0, 0, len(body), opaque) + body)
            pos += 12 + length
        del buf[:pos]
        if out:
            self.transport.write(b"".join(out))


async def serve(host: str, port: int, protocol) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(protocol, host, port)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def floor(python: str, port, protocol: str = "beanstalk") -> list[str]:
    """The command line of a floor server on `port`."""
    return [python, os.path.abspath(__file__), "--port", str(port), "--protocol", protocol]


def main(argv=None) -> int:
    import uvloop
    ap = argparse.ArgumentParser(description="a canned-reply server (see its module comment)")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--protocol", choices=("beanstalk", "counter"), default="beanstalk")
    a = ap.parse_args(argv)
    protocol = Beanstalk if a.protocol == "beanstalk" else Counter
    uvloop.run(serve(a.host, a.port, protocol))
    return 0


if __name__ == "__main__":
    sys.exit(main())
