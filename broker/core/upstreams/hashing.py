"""The hash functions of nginx's hash, consistent hash and ip_hash balancers, bit for bit.

nginx's CRC32 (src/core/ngx_crc32.h: ngx_crc32_init/update/final, ngx_crc32_long) is
the standard reflected polynomial 0xEDB88320 with the initial and final xor, the one
zlib's crc32 computes, so incremental updates become one zlib.crc32 over the
concatenated bytes.

- `hash $key` (ngx_http_upstream_get_hash_peer), compatible with Cache::Memcached:
  step i adds `(crc32(REHASH KEY) >> 16) & 0x7fff` to a u32 running sum, where REHASH is
  empty at step 0 and the decimal i after; the sum modulo the total weight picks a
  server by walking the servers in order.  `memcached_steps` yields the running sums.
- `hash $key consistent` (ngx_http_upstream_update_chash): ketama, compatible with
  Cache::Memcached::Fast.  Each server gets 160 points per unit of weight:
  point_0 = crc32(HOST "\\0" PORT LE32(0)), point_j = crc32(HOST "\\0" PORT LE32(point_j-1)),
  HOST and PORT split from the server string as written (`split_server`).  Points are
  sorted and repeated hash values dropped; a key's crc32 finds the first point at or
  above it (the index may be one past the end: the caller takes it modulo the count).
- `ip_hash` (ngx_http_upstream_ip_hash_module.c): the first three bytes of an IPv4
  address or all 16 of an IPv6 one; from 89, `hash = (hash * 113 + byte) % 6271` over
  those bytes, once per try, continuing from the previous try's hash.
"""
from __future__ import annotations

import bisect
import zlib
from typing import Iterator, Sequence

POINTS_PER_WEIGHT = 160
IP_HASH_START, IP_HASH_MUL, IP_HASH_MOD = 89, 113, 6271
NON_IP_KEY = b"\0\0\0"          # nginx's pseudo address for a client that is not IP (unix:)


def memcached_steps(key: bytes) -> Iterator[int]:
    """The running u32 sum of `hash $key` after step 0, 1, 2, ... (endless)."""
    total, rehash = 0, 0
    while True:
        prefix = str(rehash).encode() if rehash else b""
        total = (total + ((zlib.crc32(prefix + key) >> 16) & 0x7FFF)) & 0xFFFFFFFF
        rehash += 1
        yield total


def ip_key(client_ip: str) -> bytes:
    """The bytes ip_hash hashes: 3 for IPv4, 16 for IPv6, nginx's 3 zeros otherwise."""
    import ipaddress        # (here: not on zstalkd's start path)
    try:
        address = ipaddress.ip_address(client_ip)
    except ValueError:
        return NON_IP_KEY
    return address.packed[:3] if address.version == 4 else address.packed


def ip_hash_steps(key: bytes) -> Iterator[int]:
    """ip_hash's hash after try 0, 1, 2, ... (endless): each try hashes the bytes again."""
    value = IP_HASH_START
    while True:
        for byte in key:
            value = (value * IP_HASH_MUL + byte) % IP_HASH_MOD
        yield value


def split_server(server: str) -> tuple[bytes, bytes]:
    """HOST and PORT of a server string, as ngx_http_upstream_update_chash splits it: at
    the last ':' when only digits follow it, else the whole string with an empty port.
    (nginx also takes "unix:PATH" as HOST=PATH; a zstalk server is always TCP.)"""
    raw = server.encode()
    head, colon, tail = raw.rpartition(b":")
    if colon and (not tail or tail.isdigit()):
        return head, tail
    return raw, b""


def server_points(server: str, weight: int) -> list[int]:
    """The ketama points of one server: 160 per unit of weight, each chained on the last."""
    host, port = split_server(server)
    base = host + b"\0" + port
    points, previous = [], 0
    for _ in range(POINTS_PER_WEIGHT * weight):
        previous = zlib.crc32(base + previous.to_bytes(4, "little"))
        points.append(previous)
    return points


class Ring:
    """The consistent-hash ring: sorted unique point hashes and the server string of each."""
    __slots__ = ("hashes", "owners")

    def __init__(self, servers: Sequence[tuple[str, int]]) -> None:
        """From (server string, weight) in config order, down servers included (nginx
        keeps their points and skips them at lookup, so the ring does not move)."""
        points = [(h, server) for server, weight in servers for h in server_points(server, weight)]
        points.sort(key=lambda point: point[0])     # stable: of two equal hashes, the first
        self.hashes: list[int] = []
        self.owners: list[str] = []
        for h, server in points:
            if not self.hashes or self.hashes[-1] != h:
                self.hashes.append(h)
                self.owners.append(server)

    def find(self, key: bytes) -> int:
        """ngx_http_upstream_find_chash_point: the first point >= crc32(key) (may be len)."""
        return bisect.bisect_left(self.hashes, zlib.crc32(key))

    def server_at(self, index: int) -> str:
        """The server string of the point at `index`, wrapping around the ring."""
        return self.owners[index % len(self.owners)]
