"""A 100-byte round trip between two Python processes on the Rust engine, against the
asyncio floor of the same channel, in paired rounds (issue 40: at most 1.3x the floor).

The floor is ``bench/python_rtt_floor.py``'s ``add_reader`` style: an event loop on both
sides, readiness from ``add_reader``, ``recv`` and ``send`` on the socket, no framing and
no decode (the style that can also receive descriptors). The engine rows run the same
ping-pong as handoff messages through ``handoff.engine`` (the handshake first, then a
``msg`` with a body of ``{"seq": n, "data": <100 bytes>}`` encoded and decoded by
``handoff.codec`` on both sides, as an application does), on the same kind of socket pair;
the ``no codec`` row sends and echoes the body as it is (what the engine and its driver
add on their own), and the ``native codec`` row packs and reads the body with the
extension's own codec, called directly (``PlainCodec.pack`` and ``BodyReader.read``, no
Python around them): the least that any node which decodes and encodes the body can add
to the engine. The ``Node`` rows are what applications run: ``handoff.Node`` on the
engine (``engine=True``) and the Python implementation, each side a node, the pinger's
``peer.send`` and ``node.recv`` against the echo's, over the node's own TCP listener or
Unix socket.

Each style has an echo process of its own, forked once; the pinger runs every style in one
event loop, one batch at a time, the order rotating each round, so that a drift of the
machine falls on all of them alike. ``--pin`` runs the pinger on the first CPU and every
echo on the second (where there are two), so that none gains or loses by where its
process was put; the round trips themselves then change (on this machine TCP's floor
halves), so the default leaves placement to the scheduler, as the floor script does.
``--one-cpu`` runs every process on the first CPU: a round trip is then the CPU time of
both sides one after the other, with no wake-up of another CPU in it (on a VM, where such
wake-ups vary most, the steadiest of the three). The figure of a style is the median of its batches; the
ratio to the floor is the median of the rounds' ratios, with their range.

    .venv/bin/python bench/python_engine_rtt.py [--round-trips N] [--rounds R] [--pin | --one-cpu] [--codec-steps]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from python_rtt_floor import MESSAGE_BYTES, echo_add_reader, ping_add_reader, socket_pair  # noqa: E402

SECRET = b"bench secret"
TYPE = "handoff.bench.Ping"
STYLES = (
    "add_reader",
    "engine",
    "engine, no codec",
    "engine, native codec",
    "Node on the engine",
    "Node (Python)",
)
#: How each engine style's echo treats a body (``handoff.codec``, as it is, the extension's codec).
ENGINE_CODECS = {"engine": "codec", "engine, no codec": "none", "engine, native codec": "native"}
NODE_STYLES = {"Node on the engine": True, "Node (Python)": False}
#: ``--codec-steps``: the native codec's steps one at a time, the pinger sending the body as
#: it is and not reading the answer (how much each call into the extension costs in the
#: ping-pong, where it runs with caches the other side just used, against its ``timeit``).
CODEC_STEPS = {"echo reads only": "read", "echo packs only": "pack"}


async def echo_node(w: int, channel: str, engine: bool) -> None:
    """A node that echoes every message to its sender; writes its address to ``w``."""
    from handoff import Node

    async with Node("bench-echo", secret=SECRET, listen="127.0.0.1:0", engine=engine, shm=channel == "unix") as node:
        addr = node.listen_addr if channel == "tcp" else node.unix_addr
        os.write(w, addr.encode() + b"\n")
        os.close(w)
        while True:
            env = await node.recv()
            if env.type_name == "bench.Stop":
                break
            await env.sender.send(env.type_name, env.body)


def native_codec():
    """The extension's codec, called directly: ``(pack(value) -> bytes, read(body, frames)
    -> value)``, as ``handoff.codec`` makes them (its limits and types)."""
    from handoff import codec

    plain, read = codec._PLAIN, codec._reader
    threshold = codec.DEFAULT_FRAME_THRESHOLD
    return (lambda value: plain.pack(value, threshold)), (lambda body, frames: read(body, frames)[0])


#: What the ``echo packs only`` style answers: a body of the same shape and size.
ANSWER = {"seq": 0, "data": bytes(MESSAGE_BYTES)}


async def echo_engine(sock, codec: str = "codec") -> None:
    from handoff.codec import decode_body, encode_body
    from handoff.engine import Driver, Engine
    from handoff.errors import PeerClosed

    pack, read = native_codec()
    driver = Driver(Engine("bench-echo", SECRET))
    conn = driver.adopt(sock, "acceptor", "bench pinger")
    await conn.ready(10)
    while True:
        try:
            got = await conn.recv()
        except PeerClosed:
            break
        if codec == "codec":
            value = decode_body(got.body, got.frames, got.type_name)
            enc = encode_body(value)
            conn.send_now(got.type_name, enc.body, enc.frames)
        elif codec == "native":
            conn.send_now(got.type_name, pack(read(got.body, got.frames)), ())
        elif codec == "read":
            read(got.body, got.frames)
            conn.send_now(got.type_name, got.body, got.frames)
        elif codec == "pack":
            conn.send_now(got.type_name, pack(ANSWER), ())
        else:
            conn.send_now(got.type_name, got.body, got.frames)
    driver.close()


#: ``"apart"`` (``--pin``): the pinger on the first CPU, every echo on the second;
#: ``"one"`` (``--one-cpu``): every process on the first CPU; ``None``: the scheduler's choice.
PIN = None


def pin(cpu: int) -> None:
    """Places this process as ``--pin`` or ``--one-cpu`` ask: with ``--pin`` (and two CPUs
    or more) every echo (``cpu`` 1) on the second CPU and the pinger (``cpu`` 0) on the
    first, so that no style gains or loses by where the scheduler put its process; with
    ``--one-cpu`` every process on the first."""
    cpus = sorted(os.sched_getaffinity(0))
    if PIN == "apart" and len(cpus) >= 2:
        os.sched_setaffinity(0, {cpus[cpu]})
    elif PIN == "one":
        os.sched_setaffinity(0, {cpus[0]})


def fork_echo(channel: str, style: str):
    """A socket pair whose other end a forked process echoes in ``style``: (socket, pid);
    for a ``Node`` style, the echo node's address instead of a socket."""
    if style in NODE_STYLES:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            pin(1)
            asyncio.run(echo_node(w, channel, NODE_STYLES[style]))
            os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            return f.readline().strip(), pid
    a, b = socket_pair(channel)
    pid = os.fork()
    if pid == 0:
        a.close()
        pin(1)
        if style == "add_reader":
            asyncio.run(echo_add_reader(b))
        else:
            asyncio.run(echo_engine(b, codec=ENGINE_CODECS[style]))
        os._exit(0)
    b.close()
    return a, pid


async def measure(channel: str, n: int, rounds: int) -> dict:
    from handoff.codec import decode_body, encode_body
    from handoff.engine import Driver, Engine

    echoes = {style: fork_echo(channel, style) for style in STYLES}
    pin(0)
    driver = Driver(Engine("bench-pinger", SECRET))
    conns = {}
    for style in ENGINE_CODECS:
        conns[style] = driver.adopt(echoes[style][0], "dialer", style)
        await conns[style].ready(10)
    from handoff import Node

    nodes, peers = {}, {}
    for style, engine in NODE_STYLES.items():
        nodes[style] = await Node(f"bench-pinger-{int(engine)}", secret=SECRET, engine=engine).start()
        peers[style] = await nodes[style].connect(echoes[style][0], channel="tcp" if channel == "tcp" else None)
    data = os.urandom(MESSAGE_BYTES)
    raw = encode_body({"seq": 0, "data": data}).body
    pack, read = native_codec()

    async def ping(style: str, k: int) -> None:
        if style == "add_reader":
            await ping_add_reader(echoes[style][0], k)
            return
        if style in NODE_STYLES:
            node, peer = nodes[style], peers[style]
            for seq in range(k):
                await peer.send(TYPE, {"seq": seq, "data": data})
                (await node.recv(30)).body
            return
        conn = conns[style]
        for seq in range(k):
            if style == "engine":
                enc = encode_body({"seq": seq, "data": data})
                conn.send_now(TYPE, enc.body, enc.frames)
                got = await conn.recv(30)
                decode_body(got.body, got.frames, got.type_name)
            elif style == "engine, native codec":
                conn.send_now(TYPE, pack({"seq": seq, "data": data}), ())
                got = await conn.recv(30)
                read(got.body, got.frames)
            else:
                conn.send_now(TYPE, raw, ())
                await conn.recv(30)

    for style in STYLES:
        await ping(style, 500)  # warm-up
    per_rt: dict[str, list[float]] = {style: [] for style in STYLES}
    for r in range(rounds):
        order = STYLES[r % len(STYLES) :] + STYLES[: r % len(STYLES)]
        for style in order:
            t = time.perf_counter()
            await ping(style, n)
            per_rt[style].append((time.perf_counter() - t) / n)
    driver.close()
    for style, node in nodes.items():
        await peers[style].send("bench.Stop", {})
        await node.close()
    for style, (sock, pid) in echoes.items():
        if style not in NODE_STYLES:
            sock.close()
        os.waitpid(pid, 0)
    return per_rt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--round-trips", type=int, default=2000, help="per batch")
    parser.add_argument("--rounds", type=int, default=9, help="batches of each style, interleaved")
    place = parser.add_mutually_exclusive_group()
    place.add_argument("--pin", action="store_true", help="the pinger on one CPU, the echoes on another")
    place.add_argument("--one-cpu", action="store_true", help="every process on the first CPU")
    parser.add_argument(
        "--codec-steps",
        action="store_true",
        help="add the native codec's steps one at a time (echo reads only, packs only)",
    )
    args = parser.parse_args()
    global PIN, STYLES
    if args.codec_steps:
        STYLES = STYLES + tuple(CODEC_STEPS)
        ENGINE_CODECS.update(CODEC_STEPS)
    PIN = "apart" if args.pin else "one" if args.one_cpu else None
    if args.round_trips < 1 or args.rounds < 1:
        parser.error("--round-trips and --rounds must be at least 1")
    print(
        f"100-byte round trip between two Python processes: asyncio floor vs the Rust engine "
        f"({args.rounds} interleaved rounds of {args.round_trips})"
    )
    for channel in ("unix", "tcp"):
        per_rt = asyncio.run(measure(channel, args.round_trips, args.rounds))
        floor = per_rt["add_reader"]
        for style in STYLES:
            times = per_rt[style]
            line = f"{channel:4} {style:20} median {statistics.median(times) * 1e6:7.1f} µs  min {min(times) * 1e6:7.1f} µs"
            if style != "add_reader":
                ratios = [t / f for t, f in zip(times, floor)]
                line += (
                    f"  / floor: median {statistics.median(ratios):.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f})"
                )
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
