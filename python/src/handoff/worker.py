"""``python -m handoff.worker``: a Python node that serves the demo protocol (spec Appendix A).

Same options as ``handoff node`` (``--name``, ``--listen``, ``--host-id``,
``--secret-file``, ``--connect``, ``--accept-v2``, ``--accept-v1`` …) and the same ready
line on standard output,
printed once its ``--connect`` connections are up (same-host ones switched to shm)::

    {"event": "ready", "name": "py-a", "listen": "tcp://127.0.0.1:40123", "host_id": "…", "pid": 1234}

It answers ``handoff.demo.Payload`` (verifies the BLAKE3 digest, answers ``Receipt``),
``handoff.demo.SendRequest`` (answers a ``Payload``; ``data`` in shared memory when the
asker is reached over shm), ``handoff.bench.Ping`` (echo), ``handoff.bench.Blob``,
``handoff.demo.Hold`` / ``Release`` / ``Forward`` (answers ``Held``),
``handoff.demo.BlobWork`` (reads the data handle — from a local file given with
``--dataset UUID=PATH``, else from the sender — and answers ``BlobReceipt`` with the path
the bytes took) and ``handoff.admin.StatsRequest`` (answers ``Stats``). Logs go to
standard error (``HANDOFF_LOG=info|debug|warn``, default warn).

No peer can take it down (spec §9.1, Appendix A). What one peer's requests can make it
do is bounded, each bound a flag (``--help`` lists them with their defaults):

- the node's bounds (:class:`handoff.bounds.Bounds`): ``--max-buffered-bytes-per-peer``
  (1 GiB) and ``--max-buffered-bytes`` (4 GiB) of messages read and not yet handled,
  beyond which it stops reading; ``--max-handshakes`` (256), ``--max-connections``
  (1024), ``--max-owner-connections`` (64), ``--handshake-timeout`` (10 s),
  ``--progress-timeout`` (30 s of silence inside a message), ``--write-timeout``
  (120 s without progress writing to a peer),
  ``--lease-wait`` (30 s), ``--max-shm-bytes-per-peer`` (8 GiB),
  ``--max-shm-leases-per-peer`` (65 536), ``--max-ticket-bytes`` (16 GiB),
  ``--max-ticket-bytes-per-peer`` (8 GiB);
- the demo protocol's (:class:`WorkerBounds`): ``--max-request-bytes`` (1 GiB per
  ``SendRequest``; larger ones get a warning and no answer), ``--max-preparing-bytes``
  (2 GiB of payloads prepared or being sent at once), ``--max-held`` (1024) and
  ``--max-held-bytes`` (4 GiB) kept by ``Hold`` for one peer (beyond: ``Held`` of 0
  bytes, not kept), ``--max-relays`` (1024 ``Forward`` relays waiting), and
  ``--answer-queue`` (64): answers to each peer go out in order through a queue of
  their own, so a peer that does not read fills only its own queue, whose further
  answers are dropped with a warning until it drains.

TLS (spec WIRE.md §3.1): ``--tls-cert``, ``--tls-key`` and ``--tls-ca`` (PEM files: this
node's certificate chain, its key, the CA trusted for peers' certificates; all three or
none) run every TCP connection inside mutual TLS; ``--tls-server-name`` is the name to
expect in the certificates of the nodes it connects to, instead of each address's host.

A body that does not decode, or any request that fails, is logged (at most 10
warnings per peer per 10 s, then a count) and the worker keeps serving. ``--delay``
makes it wait before handling each message, as a slow application would (for tests).

This module is the command line (options, the ready line, signals); the protocol itself
is served by :mod:`handoff.demo_server`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import re
import signal
import sys
from pathlib import Path

from .bounds import Bounds
from .data import FileDataset, dataset_key
from .demo_server import TYPES, Worker, WorkerBounds
from .node import Node
from .tls import TlsConfig

log = logging.getLogger("handoff.worker")


def read_secret(path: str) -> bytes:
    """A secret file's bytes; a trailing newline is not part of the secret."""
    data = Path(path).read_bytes().rstrip(b"\r\n")
    if not data:
        raise SystemExit(f"error: the secret file {path} is empty")
    return data


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m handoff.worker", description="A Python handoff node serving the demo protocol."
    )
    p.add_argument("--name", required=True, help="the node's name")
    p.add_argument("--listen", default="127.0.0.1:0", help="TCP address to listen on (default 127.0.0.1:0)")
    p.add_argument("--host-id", default=None, help="host identity (default: from the kernel's machine and boot ids)")
    p.add_argument("--secret-file", default=None, help="file holding the cluster secret (trailing newline ignored)")
    p.add_argument("--connect", action="append", default=[], help="peer to connect to at start (repeatable)")
    p.add_argument("--redeem", choices=("eager", "lazy"), default="eager", help="when received tickets are redeemed")
    p.add_argument(
        "--ticket-threshold",
        type=int,
        default=None,
        help="send buffers of at least this many bytes to TCP peers as tickets",
    )
    p.add_argument("--lease-ttl-ms", type=int, default=30_000, help="how long a ticket hold lasts without renewal")
    p.add_argument("--pull-timeout-ms", type=int, default=30_000, help="how long a pull may wait for the owner")
    p.add_argument("--no-shm", action="store_true", help="no Unix socket, no shared memory")
    p.add_argument(
        "--accept-v2",
        action="store_true",
        help="also accept peers that speak only protocol version 2 (announce 2..=3), while a cluster upgrades; "
        "DANGEROUS: in version 2 a peer without the cluster secret can authenticate by reflecting the proofs of "
        "the nodes themselves (spec WIRE.md §5.6, §5.8)",
    )
    p.add_argument(
        "--accept-v1",
        action="store_true",
        help="also accept peers that speak only protocol version 1, and version 2 with it (announce 1..=3); "
        "DANGEROUS: as --accept-v2, and version 1's handshake reveals this node's id, name, host id, pid and "
        "addresses to anyone who connects, before any proof of the secret (spec WIRE.md §5.4, §5.6)",
    )
    p.add_argument(
        "--dataset",
        action="append",
        default=[],
        metavar="UUID=PATH",
        help="a dataset this node reads itself: data handles for UUID bind to the file or directory PATH (repeatable)",
    )
    t = p.add_argument_group(
        "TLS",
        "TLS on every TCP connection, opened or accepted (spec WIRE.md §3.1): all three of --tls-cert, "
        "--tls-key and --tls-ca, or none. A peer without TLS is refused with tls-required.",
    )
    t.add_argument("--tls-cert", metavar="PEM", default=None, help="this node's certificate chain")
    t.add_argument("--tls-key", metavar="PEM", default=None, help="the private key of --tls-cert")
    t.add_argument("--tls-ca", metavar="PEM", default=None, help="the CA (or CAs) trusted for peers' certificates")
    t.add_argument(
        "--tls-server-name",
        metavar="NAME",
        default=None,
        help="the name to expect in the certificates of the nodes this one connects to "
        "(default: the host part of each address dialed)",
    )
    g = p.add_argument_group(
        "bounds",
        "What peers can make this node hold (spec §9.1 and Appendix A; the defaults are the reference's). "
        "Sizes take a suffix: 64KiB, 8MiB, 1GiB (or K, M, G); times are in milliseconds, as for handoff node.",
    )
    d, w = Bounds(), WorkerBounds()

    def bound(flag: str, kind, default, meta: str, text: str) -> None:
        if kind is parse_ms:
            shown = f"{round(default * 1000)}"
        else:
            shown = human_size(default) if kind is parse_size else f"{default:g}" if kind is float else default
        g.add_argument(flag, type=kind, default=default, metavar=meta, help=f"{text} (default {shown})")

    bound(
        "--max-request-bytes",
        parse_size,
        w.max_request_bytes,
        "SIZE",
        "most bytes one SendRequest may ask for; a larger one gets a warning and no answer",
    )
    bound(
        "--max-preparing-bytes",
        parse_size,
        w.max_preparing_bytes,
        "SIZE",
        "most bytes of SendRequest payloads being prepared or sent at once, all peers together",
    )
    bound("--max-held", int, w.max_held, "N", "most Hold items kept for one peer; beyond, Held says 0 bytes")
    bound("--max-held-bytes", parse_size, w.max_held_bytes, "SIZE", "most bytes kept by Hold for one peer")
    bound("--max-relays", int, w.max_relays, "N", "most Forward relays waiting for their Held answer")
    bound(
        "--answer-queue",
        int,
        w.answer_queue,
        "N",
        "most answers queued for one peer; further ones are dropped with a warning until it reads",
    )
    bound(
        "--max-buffered-bytes-per-peer",
        parse_size,
        d.max_buffered_bytes_per_peer,
        "SIZE",
        "bytes of one peer's messages read and not yet handled; then the node stops reading that peer",
    )
    bound("--max-buffered-bytes", parse_size, d.max_buffered_bytes, "SIZE", "the same, all peers together")
    bound("--max-handshakes", int, d.max_handshakes, "N", "handshakes in progress at once; the oldest makes room")
    bound("--max-connections", int, d.max_connections, "N", "established connections")
    bound(
        "--max-owner-connections",
        int,
        d.max_owner_connections,
        "N",
        "connections dialed to reach ticket owners that are kept open; the one unused longest makes room",
    )
    bound(
        "--min-buffered-bytes-per-peer",
        parse_size,
        d.min_buffered_bytes_per_peer,
        "SIZE",
        "bytes any peer may buffer whatever all peers hold together (its guaranteed share)",
    )
    bound("--handshake-timeout-ms", parse_ms, d.handshake_timeout, "MS", "time to complete a handshake")
    bound("--progress-timeout-ms", parse_ms, d.progress_timeout, "MS", "silence allowed in the middle of a message")
    bound(
        "--write-timeout-ms",
        parse_ms,
        d.write_timeout,
        "MS",
        "a write to a peer that reads nothing fails after this, and its connection closes",
    )
    bound(
        "--lease-wait-ms",
        parse_ms,
        d.lease_wait,
        "MS",
        "how long a send waits for a peer to release shared memory or tickets before it fails",
    )
    bound(
        "--max-shm-bytes-per-peer",
        parse_size,
        d.max_shm_bytes_per_peer,
        "SIZE",
        "bytes of shared memory leased to one peer",
    )
    bound("--max-shm-leases-per-peer", int, d.max_shm_leases_per_peer, "N", "shared-memory leases held for one peer")
    bound("--max-ticket-bytes", parse_size, d.max_ticket_bytes, "SIZE", "bytes pinned by ticket leases, in total")
    bound(
        "--max-ticket-bytes-per-peer",
        parse_size,
        d.max_ticket_bytes_per_peer,
        "SIZE",
        "bytes pinned by ticket leases issued to one peer",
    )
    bound(
        "--answer-queue-bytes",
        parse_size,
        w.answer_queue_bytes,
        "SIZE",
        "bytes of received data waiting in one peer's answer queue",
    )
    bound(
        "--delay-ms", parse_ms, 0.0, "MS", "wait this long before handling each message: a slow application, for tests"
    )
    args = p.parse_args(argv)
    given = [f for f in ("tls_cert", "tls_key", "tls_ca") if getattr(args, f)]
    if given and len(given) < 3:
        missing = ", ".join("--" + f.replace("_", "-") for f in ("tls_cert", "tls_key", "tls_ca") if f not in given)
        p.error(f"TLS needs all of --tls-cert, --tls-key and --tls-ca, or none; missing {missing}")
    if args.tls_server_name and not given:
        p.error("--tls-server-name needs TLS on (--tls-cert, --tls-key and --tls-ca)")
    for ds in args.dataset:
        if "=" not in ds:
            p.error(f"--dataset wants UUID=PATH, got {ds!r}")
    try:
        args.bounds = node_bounds(args)
        args.worker_bounds = worker_bounds(args)
    except ValueError as e:
        p.error(str(e))
    return args


_SIZE = re.compile(r"(\d+)\s*([KMGT]?)(i?B)?", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``4096``, ``64KiB``, ``8M``, ``1GiB`` → bytes (powers of 1024)."""
    m = _SIZE.fullmatch(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4096, 64KiB, 8MiB, 1GiB)")
    return int(m.group(1)) << (10 * " KMGT".index(m.group(2).upper() or " "))


def parse_ms(text: str) -> float:
    """Milliseconds on the command line → seconds."""
    try:
        ms = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of milliseconds: {text!r}") from None
    if ms < 0:
        raise argparse.ArgumentTypeError(f"milliseconds cannot be negative: {text!r}")
    return ms / 1000


def human_size(n: int) -> str:
    """``1073741824`` → ``1GiB`` (exact multiples only)."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def node_bounds(args: argparse.Namespace) -> Bounds:
    """The node's bounds (:class:`handoff.bounds.Bounds`) from the command line."""
    return dataclasses.replace(
        Bounds(),
        max_buffered_bytes_per_peer=args.max_buffered_bytes_per_peer,
        max_buffered_bytes=args.max_buffered_bytes,
        max_handshakes=args.max_handshakes,
        max_connections=args.max_connections,
        max_owner_connections=args.max_owner_connections,
        min_buffered_bytes_per_peer=args.min_buffered_bytes_per_peer,
        handshake_timeout=args.handshake_timeout_ms,
        progress_timeout=args.progress_timeout_ms,
        write_timeout=args.write_timeout_ms,
        lease_wait=args.lease_wait_ms,
        max_shm_bytes_per_peer=args.max_shm_bytes_per_peer,
        max_shm_leases_per_peer=args.max_shm_leases_per_peer,
        max_ticket_bytes=args.max_ticket_bytes,
        max_ticket_bytes_per_peer=args.max_ticket_bytes_per_peer,
    )


def worker_bounds(args: argparse.Namespace) -> WorkerBounds:
    """The demo protocol's bounds (:class:`WorkerBounds`) from the command line."""
    w = WorkerBounds(
        max_request_bytes=args.max_request_bytes,
        max_preparing_bytes=args.max_preparing_bytes,
        max_held=args.max_held,
        max_held_bytes=args.max_held_bytes,
        max_relays=args.max_relays,
        answer_queue=args.answer_queue,
        answer_queue_bytes=args.answer_queue_bytes,
        delay=args.delay_ms,
    )
    for name, value in dataclasses.asdict(w).items():
        if value < 0 or (value == 0 and name not in ("delay", "max_held", "max_held_bytes", "max_relays")):
            raise ValueError(f"--{name.replace('_', '-')} must be positive")
    return w


def _raise_fd_limit() -> None:
    """Up to the hard limit: every connection and handshake the bounds allow needs a descriptor."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = 65536 if hard == resource.RLIM_INFINITY else hard
        if target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):
        pass


async def run(args: argparse.Namespace) -> None:
    _raise_fd_limit()
    secret = read_secret(args.secret_file) if args.secret_file else b""
    tls = (
        TlsConfig.from_files(args.tls_cert, args.tls_key, args.tls_ca, server_name=args.tls_server_name)
        if args.tls_cert
        else None
    )
    node = Node(
        args.name,
        host_id=args.host_id,
        secret=secret,
        listen=args.listen,
        shm=not args.no_shm,
        types=TYPES,
        redeem=args.redeem,
        ticket_threshold=args.ticket_threshold,
        lease_ttl=args.lease_ttl_ms / 1000,
        pull_timeout=args.pull_timeout_ms / 1000,
        bounds=args.bounds,
        accept_v1=args.accept_v1,
        accept_v2=args.accept_v2,
        tls=tls,
    )
    for d in args.dataset:
        uuid, path = d.split("=", 1)
        node.resources.insert(dataset_key(uuid), FileDataset(path))
    await node.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        for addr in args.connect:
            peer = await node.connect(addr)
            log.info("connected to %s (%s, %s)", peer.name, peer.locality, peer.channel)
        print(
            json.dumps(
                {
                    "event": "ready",
                    "name": node.name,
                    "listen": node.listen_addr,
                    "host_id": node.host_id,
                    "pid": os.getpid(),
                }
            ),
            flush=True,
        )
        serving = asyncio.ensure_future(Worker(node, args.worker_bounds).serve())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        for f in (serving, stopping):
            f.cancel()
        if serving.done() and not serving.cancelled() and serving.exception():
            raise serving.exception()
    finally:
        await node.close()


def main(argv=None) -> int:
    level = os.environ.get("HANDOFF_LOG", "warn").split(",")[0].strip().lower()
    level = {
        "warn": "WARNING",
        "warning": "WARNING",
        "error": "ERROR",
        "info": "INFO",
        "debug": "DEBUG",
        "trace": "DEBUG",
    }.get(level, "WARNING")
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        asyncio.run(run(args))
    except KeyboardInterrupt:
        pass
    except Exception as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
