"""Hashing a redeemed ticket while its bytes arrive (handoff.tickets.StreamDigest)."""

import os

from handoff.tickets import digest
from handoff_pure.leases import StreamDigest


def test_a_stream_digest_equals_the_digest_of_the_whole_buffer_however_it_is_fed():
    data = os.urandom(13 << 20)
    for steps in (
        [len(data)],
        [1, 5 << 20, 5 << 20, 9 << 20, 9 << 20 + 7, len(data)],
        list(range(0, len(data), 1 << 20)),
    ):
        buf = bytearray(len(data))
        view = memoryview(buf)
        h = StreamDigest(view)
        for filled in steps:
            view[:filled] = data[:filled]
            h.feed(filled)
        view[:] = data
        assert h.finish().result(10) == digest(data)


def test_a_cancelled_stream_digest_never_completes():
    h = StreamDigest(memoryview(bytearray(9 << 20)))
    h.feed(5 << 20)
    h.cancel()
    assert h.result.cancelled()


async def test_a_large_ticket_is_hashed_as_it_arrives_and_a_wrong_digest_is_caught():
    import pytest
    from handoff import Buffer, Node, Ticket, TicketCorrupt
    from handoff_pure import wire

    data = os.urandom(24 << 20)
    a = Node("owner", secret=b"s", listen="127.0.0.1:0")
    b = Node("holder", secret=b"s", redeem="lazy")
    async with a, b:
        await b.connect(a.listen_addr, channel="tcp")
        await (await a.wait_for_peer("holder")).send("t.X", {"d": Buffer(data)}, by_ticket=True)
        ticket = (await b.recv(5)).body["d"]
        assert bytes(await ticket.redeem()) == data
        # The digest the ticket carries (XXH3-128 between peers with the cap, else BLAKE3), wrong.
        wrong = {"xxh3": bytes(16)} if ticket.desc.xxh3 is not None else {"digest": bytes(32)}
        bad = Ticket(b, wire.TicketDesc(**{**ticket.desc.__dict__, **wrong}), "owner")
        with pytest.raises(TicketCorrupt):
            await bad.redeem()
        ranged = await ticket.read(1 << 20, 12 << 20)  # a range is not checked against the digest
        assert bytes(ranged) == data[1 << 20 : 13 << 20]
        ticket.release()
