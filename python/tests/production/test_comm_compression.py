"""Issue 25, item 8: with compression on, a same-host comm does not compress.

Dask decides per comm, in its handshake: a comm whose ``same_host`` is true offers no
compression. Dask's TCP comm judges that by comparing IP addresses, so a peer on another
address of the same machine (here a listener on 127.0.0.2, reached from 127.0.0.1) gets
compressed frames. A handoff comm knows its peer's host id from the handoff handshake, so
every same-host comm goes without compression, whatever address it was reached at; and
the frames that cross a same-host comm are really sent as they are (Dask's zlib
compressor is counted while the message is written)."""

from __future__ import annotations

import asyncio

import dask
import distributed.protocol.compression as compression
import numpy as np
from distributed.protocol import to_serialize

from .one_message import send_one

SECRET = {"distributed.comm.handoff.secret": "production comm test secret"}


async def _compression(scheme: str, host: str, monkeypatch) -> tuple:
    """(what each end's handshake chose, how many frames zlib compressed)."""
    calls: list = []
    zlib = compression.compressions["zlib"]

    def counted(data, *args, **kwargs):
        calls.append(len(data))
        return zlib.compress(data, *args, **kwargs)

    monkeypatch.setitem(compression.compressions, "zlib", zlib._replace(compress=counted))

    with dask.config.set({**SECRET, "distributed.comm.compression": "zlib"}):
        got, accepted, comm = await send_one(
            f"{scheme}://{host}:0", {"op": "data", "x": to_serialize(np.zeros(1 << 20, dtype=np.uint8))}
        )
    ends = [comm.handshake_options.get("compression"), accepted.handshake_options.get("compression")]
    assert got and got["x"].nbytes == 1 << 20
    return sorted(map(str, ends)), len(calls)


async def test_a_same_host_comm_does_not_compress_whatever_address_it_was_reached_at(monkeypatch):
    # 127.0.0.2 from 127.0.0.1: Dask's TCP comm takes it for another host and compresses.
    ends, compressed = await asyncio.wait_for(_compression("tcp", "127.0.0.2", monkeypatch), 60)
    assert ends == ["zlib", "zlib"] and compressed >= 1, (ends, compressed)
    for host in ("127.0.0.1", "127.0.0.2"):
        ends, compressed = await asyncio.wait_for(_compression("handoff", host, monkeypatch), 60)
        assert ends == ["None", "None"] and compressed == 0, (host, ends, compressed)
