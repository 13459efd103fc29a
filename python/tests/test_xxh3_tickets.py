"""Tickets with an XXH3-128 digest (spec §7.5): a peer that announced ``xxh3`` gets one, a peer
that did not gets BLAKE3, and an XXH3 ticket is never forwarded to a peer that would refuse it
(§7.8: the bytes go instead). Both digests of the vector ``msg-ticket-xxh3`` are this peer's."""

from __future__ import annotations

import json
import os
from pathlib import Path

from handoff import Node, Ticket
from handoff.tickets import digest
from handoff_pure.leases import xxh3_digest

MIB = 1 << 20


class OlderNode(Node):
    """A node of before ``xxh3``: it does not announce it (and so must never be sent one)."""

    @property
    def caps(self) -> list:
        return [c for c in super().caps if c != "xxh3"]


def test_both_digests_are_the_vectors():
    desc = json.loads((Path(__file__).resolve().parents[2] / "spec" / "vectors" / "msg-ticket-xxh3.json").read_text())
    d = desc["digests"]
    buffer = bytes(i % 251 for i in range(MIB))
    assert (digest(buffer).hex(), xxh3_digest(buffer).hex()) == (d["blake3"], d["xxh3_128"])
    assert (digest(b"abc").hex(), xxh3_digest(b"abc").hex()) == (d["abc"]["blake3"], d["abc"]["xxh3_128"])
    assert desc["header"]["f"][0]["xxh3"]["$bin"] == d["xxh3_128"]


async def test_the_digest_follows_the_holders_capability_and_forwarding_respects_it():
    a = Node("a", secret=b"s", listen="127.0.0.1:0", redeem="lazy")
    b = Node("b", secret=b"s", listen="127.0.0.1:0", redeem="lazy")
    old = OlderNode("old", secret=b"s", listen="127.0.0.1:0", redeem="lazy")
    async with a, b, old:
        await b.connect(a.listen_addr, channel="tcp")
        await old.connect(a.listen_addr, channel="tcp")
        to_old = await b.connect(old.listen_addr, channel="tcp")
        data = os.urandom(2 * MIB)
        # To a peer that announced xxh3: XXH3-128, and the redemption checks it.
        await (await a.wait_for_peer("b")).send("t.X", {"d": data}, by_ticket=True)
        ticket = (await b.recv(5)).body["d"]
        assert isinstance(ticket, Ticket) and ticket.desc.digest is None
        assert ticket.desc.xxh3 == xxh3_digest(data)
        # To one that did not: BLAKE3.
        await (await a.wait_for_peer("old")).send("t.X", {"d": data}, by_ticket=True)
        direct = (await old.recv(5)).body["d"]
        assert isinstance(direct, Ticket) and (direct.desc.digest, direct.desc.xxh3) == (digest(data), None)
        assert bytes(await direct.redeem()) == data
        direct.release()
        # b forwards its XXH3 ticket to the older node: it sends the bytes, not a ticket it would refuse.
        await to_old.send("t.Y", {"d": ticket})
        got = (await old.recv(5)).body["d"]
        assert not isinstance(got, Ticket) and bytes(got) == data
        assert bytes(await ticket.redeem()) == data
        ticket.release()
