#!/usr/bin/env python3
"""How long the Python peer takes to decode one header (``handoff_pure.wire.decode_header``).

Typical headers (a ``msg`` with one inline frame, a ``msg`` with a ticket, a ``hello``)
are timed with ``timeit`` (best of ``--repeat`` runs, in µs per decode). The hostile
cases are one 16 MiB header each, decoded once: 16 M empty maps (``80``) in an ignored
key of a ``msg``, and the same as the ``f`` of a ``hello``. A strict decoder refuses
both from the value budget of spec §9 (``malformed-header``) without building them.

Run it from the repository root with the Python peer installed::

    .venv/bin/python bench/python_header_decode.py [--repeat K] [--number N] [--skip-hostile]
"""

from __future__ import annotations

import argparse
import functools
import struct
import time
import timeit

from handoff_pure import wire

MIB16 = 16 << 20


def typical() -> dict:
    token = bytes(range(32))
    return {
        "msg inline": wire.encode_header(
            wire.Msg(
                "handoff.bench.Blob",
                b"\x82\xa3seq\x07\xa4data\xd6\x01\0\0\0\0",
                [wire.Inline(4096)],
            )
        ),
        "msg ticket": wire.encode_header(
            wire.Msg(
                "demo.Sample",
                b"\x81\xa4data\xd6\x01\0\0\0\0",
                [
                    wire.TicketDesc(
                        1 << 20,
                        "0" * 32,
                        42,
                        token,
                        token,
                        30000,
                        addr="tcp://127.0.0.1:7070",
                    )
                ],
            )
        ),
        "hello": wire.encode_header(
            wire.Hello(
                "0" * 32,
                "alpha",
                "host-a",
                4242,
                "f" * 32,
                "python",
                "handoff-py/0.1.0",
                1,
                ["inline", "shm"],
                token,
                "tcp://127.0.0.1:7070",
            )
        ),
    }


def hostile() -> dict:
    """Two 16 MiB headers of 16 M empty maps: in an ignored key of a msg, and as the f of a hello."""
    msg_head = b"\x85\xa1k\xa3msg\xa1t\xa1x\xa1b\xc4\x01\x80\xa1f\x90\xa1x\xdd"
    n = MIB16 - len(msg_head) - 4
    ignored = msg_head + struct.pack(">I", n) + b"\x80" * n
    hello = wire.encode_header(wire.Hello("0" * 32, "a", "h", 1, "p" * 32, "python", "i", 1, ["inline"], bytes(32)))
    hello_head = bytes([hello[0] + 1]) + hello[1:] + b"\xa1f\xdd"
    n = MIB16 - len(hello_head) - 4
    in_f = hello_head + struct.pack(">I", n) + b"\x80" * n
    assert len(ignored) == len(in_f) == MIB16
    return {
        "16 M empty maps in an ignored key (msg)": ignored,
        "16 M empty maps in f (hello)": in_f,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--number", type=int, default=20000)
    ap.add_argument("--skip-hostile", action="store_true")
    args = ap.parse_args()
    for name, data in typical().items():
        wire.decode_header(data)
        best = min(
            timeit.repeat(
                functools.partial(wire.decode_header, data),
                number=args.number,
                repeat=args.repeat,
            )
        )
        print(f"{name:45s} {len(data):5d} B  {best / args.number * 1e6:8.2f} µs")
    if args.skip_hostile:
        return
    for name, data in hostile().items():
        t0 = time.perf_counter()
        try:
            wire.decode_header(data)
            outcome = "accepted"
        except wire.WireError as e:
            outcome = e.code
        print(f"{name:45s} 16 MiB  {(time.perf_counter() - t0) * 1e3:8.2f} ms  {outcome}")


if __name__ == "__main__":
    main()
