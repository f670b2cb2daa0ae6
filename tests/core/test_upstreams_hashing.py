"""nginx's hash functions, against vectors worked out from its source (ngx_crc32.h,
ngx_http_upstream_hash_module.c, ngx_http_upstream_ip_hash_module.c)."""
from __future__ import annotations

import itertools

from hypothesis import given, strategies as st

from zstalk.broker.core.upstreams.hashing import (
    Ring, ip_hash_steps, ip_key, memcached_steps, server_points, split_server,
)


def crc32_by_the_table(data: bytes) -> int:
    """ngx_crc32_long with its table built from the reflected polynomial 0xEDB88320."""
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        table.append(c)
    crc = 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


@given(st.binary(max_size=64))
def test_zlib_crc32_is_nginx_crc32(data):
    import zlib
    assert zlib.crc32(data) == crc32_by_the_table(data)


def test_hash_steps_add_the_top_15_bits_of_crc32_of_the_rehash_number_and_key():
    # crc32("foo") = 0x8c736521: (>> 16) & 0x7fff = 3187; crc32("1foo") gives 6881
    steps = memcached_steps(b"foo")
    assert next(steps) == 3187
    assert next(steps) == 3187 + 6881
    third = (crc32_by_the_table(b"2foo") >> 16) & 0x7FFF
    assert next(steps) == 3187 + 6881 + third


def test_ketama_points_chain_crc32_of_host_nul_port_and_the_previous_point():
    # crc32("127.0.0.1" "\0" "8081" LE32(0)) and then LE32 of that point
    assert server_points("127.0.0.1:8081", 1)[:2] == [0x50AABCF7, 0xB8DC900A]
    assert len(server_points("127.0.0.1:8081", 3)) == 480


def test_the_server_string_splits_at_the_last_colon_only_before_digits():
    assert split_server("10.0.0.1:8000") == (b"10.0.0.1", b"8000")
    assert split_server("gpu.example") == (b"gpu.example", b"")
    assert split_server("[::1]:80") == (b"[::1]", b"80")
    assert split_server("[::1]") == (b"[::1]", b"")
    assert split_server("a:b1") == (b"a:b1", b"")
    assert split_server("a:") == (b"a", b"")


def test_without_a_port_the_points_hash_an_empty_port_not_80():
    assert server_points("a", 1) != server_points("a:80", 1)
    assert server_points("a", 1)[0] == crc32_by_the_table(b"a\0" + bytes(4))


def test_the_ring_is_sorted_without_repeats_and_wraps():
    ring = Ring([("a:1", 2), ("b:1", 1), ("b:1", 1)])      # b twice: its points repeat
    assert ring.hashes == sorted(set(ring.hashes))
    assert len(ring.hashes) == 160 * 3
    assert ring.owners.count("a:1") == 320
    assert ring.find(b"") == 0                  # crc32("") = 0: the first point
    past_the_end = len(ring.hashes)
    assert ring.server_at(past_the_end) == ring.owners[0]


@given(st.binary(max_size=16))
def test_a_key_finds_the_first_point_at_or_above_its_crc32(key):
    ring = Ring([("a:1", 1), ("b:2", 2)])
    i = ring.find(key)
    h = crc32_by_the_table(key)
    assert all(p < h for p in ring.hashes[:i])
    assert i == len(ring.hashes) or ring.hashes[i] >= h


def test_ip_hash_takes_three_ipv4_bytes_and_sixteen_ipv6_bytes():
    assert ip_key("192.168.1.7") == bytes([192, 168, 1])
    assert ip_key("2001:db8::1") == bytes.fromhex("20010db8000000000000000000000001")
    assert ip_key("::ffff:192.168.1.7") == bytes(10) + b"\xff\xff" + bytes([192, 168, 1, 7])
    assert ip_key("unix:") == b"\0\0\0"


def first(steps, n: int) -> list[int]:
    return list(itertools.islice(steps, n))


def test_ip_hash_vectors_worked_from_nginx():
    # 192.168.1.x: 89 -> (89*113+192)%6271 = 3978 -> (3978*113+168)%6271 = 4441
    #   -> (4441*113+1)%6271 = 154: peer 154 % 3 = 1 of three equal peers
    assert first(ip_hash_steps(ip_key("192.168.1.200")), 3) == [154, 5654, 1196]
    assert first(ip_hash_steps(ip_key("192.168.1.1")), 1) == [154]
    # IPv6: all 16 bytes count, so ::1 and ::2 of one /64 differ
    assert first(ip_hash_steps(ip_key("2001:db8::1")), 3) == [2600, 2675, 497]
    assert first(ip_hash_steps(ip_key("2001:db8::2")), 3) == [2601, 4152, 4513]
    assert first(ip_hash_steps(ip_key("fe80::1")), 3) == [5163, 542, 2794]
    assert first(ip_hash_steps(ip_key("::1")), 3) == [5945, 1692, 1535]
    assert first(ip_hash_steps(ip_key("::ffff:192.168.1.7")), 3) == [3091, 446, 3259]
    assert first(ip_hash_steps(b"\0\0\0"), 2) == [295, 4219]
