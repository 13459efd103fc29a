"""A large ticket answer is checked against the ticket's BLAKE3 digest: from 8 MiB the
engine hashes it on a helper thread while it arrives (``HASH_BEHIND_MIN``), so the check
must still catch an owner that answers with other bytes, and must still pass true ones.

The owner here is a raw peer that speaks the wire format by hand: it sends a message with
one ticket of its own, waits for the node's ``pull`` on the same connection (spec §7.6),
and answers it with the bytes it chooses.
"""

from __future__ import annotations

import asyncio
import struct

import blake3
import msgpack
import numpy as np
import pytest
from conftest import SECRET
from handoff import Node
from handoff.errors import TicketCorrupt
from handoff_pure import wire
from helpers import RawPeer

#: Above the engine's ``HASH_BEHIND_MIN`` (8 MiB), so that the helper thread hashes it.
N = 9 << 20


def owner_answers(addr: str, truth: bytes, answer: bytes) -> int:
    """A raw owner: sends a message with a ticket for ``truth`` and answers the node's pull
    with ``answer``; the request id it answered."""
    r = RawPeer(addr, timeout=20)
    r.handshake(SECRET, host="lying-owner-host")
    ticket = wire.TicketDesc(
        n=len(truth), owner=r.node_id, lease=7, token=bytes(32), digest=blake3.blake3(truth).digest(), ttl=30_000
    )
    body = msgpack.packb({"data": msgpack.ExtType(1, struct.pack(">I", 0))}, use_bin_type=True)
    r.send(wire.encode_message(wire.Msg("test.Data", body, [ticket])))
    while True:
        _, h = r.read_header()
        if isinstance(h, wire.Pull):
            break
    assert (h.lease, h.off, h.n) == (7, 0, len(truth)), h
    r.send(wire.encode_message(wire.Pulled(h.req, len(answer))) + answer)
    # Stay connected until the node is done with the answer (it may unlease the ticket).
    try:
        while True:
            r.read_header()
    except (TimeoutError, EOFError, OSError):
        pass
    finally:
        r.sock.close()
    return h.req


@pytest.mark.parametrize("lies", [False, True], ids=["true bytes", "other bytes"])
async def test_a_large_pulled_answer_is_checked_while_it_arrives(lies):
    truth = np.random.default_rng(5).integers(0, 256, N, dtype=np.uint8).tobytes()
    answer = truth[:-1] + bytes([truth[-1] ^ 1]) if lies else truth
    async with Node("holder", secret=SECRET, listen="127.0.0.1:0", host_id="holder-host") as node:
        owner = asyncio.get_running_loop().run_in_executor(None, owner_answers, node.listen_addr, truth, answer)
        env = await node.recv(20)
        if lies:
            with pytest.raises(TicketCorrupt):
                env.body
        else:
            assert bytes(env.body["data"]) == truth
        env.release()
        for peer in list(node.peers):
            await peer.close()
        await asyncio.wait_for(owner, 20)
