"""Real nodes on the hosts of a network-namespace lab: routes, tickets across hosts, and a
partition in the middle of a pull."""

from __future__ import annotations

import asyncio
import time

from helpers import eventually
from handoff import Node
from handoff.identity import host_id

MIB = 1 << 20


async def reports(node: Node, transfer: int, until, timeout: float) -> list[dict]:
    """The chaos reports about `transfer` that reach `node`, until `until(reports)` holds."""
    got: list[dict] = []
    deadline = time.monotonic() + timeout
    while not until(got):
        left = deadline - time.monotonic()
        assert left > 0, f"reports so far: {got}"
        env = await node.recv(left)
        if env.type_name == "handoff.chaos.Report" and env.body["id"] == transfer:
            got.append(env.body)
    return got


def finished(name: str):
    return lambda got: any(r["node"] == name and r["outcome"] not in ("received", "issued") for r in got)


async def test_route_is_tcp_across_hosts_and_shm_within_one(lab, spawn_node, secret):
    here = await spawn_node(1, "rs-h1")
    there = await spawn_node(2, "rs-h2")
    # Host ids: equal within a host, different across hosts, with no HANDOFF_HOST_ID set.
    assert here.ready["host_id"] == host_id()
    assert there.ready["host_id"] != host_id()
    async with Node("py-h1", secret=secret, listen=f"{lab.hosts[1]}:0") as node:
        far = await node.connect(there.listen)
        assert (far.channel, far.locality) == ("tcp", "remote")
        near = await node.connect(here.listen)
        assert (near.channel, near.locality) == ("shm", "same-host")
        # The same payload both ways, checked by the Rust node's receipt.
        for peer in (far, near):
            await peer.send("handoff.demo.SendRequest", {"id": 1, "bytes": 4 * MIB})
            env = await node.recv(30)
            assert env.type_name == "handoff.demo.Payload"
            with env:
                assert len(env.body["data"]) == 4 * MIB


async def test_a_ticket_forwarded_over_three_hosts_is_pulled_from_its_owner(lab, spawn_node, rust_stats, secret):
    # The owner on host 2 sends a ticket to b on host 3, b forwards it to c on host 1, and c
    # pulls the bytes from the owner across the bridge.
    c = await spawn_node(1, "c", "--redeem", "lazy")
    owner = await spawn_node(2, "owner", "--ticket-threshold", "1")
    b = await spawn_node(3, "b", "--redeem", "lazy", "--connect", c.listen, "--connect", owner.listen)
    async with Node("chaos", secret=secret, listen=f"{lab.hosts[1]}:0") as node:
        to_owner = await node.connect(owner.listen)
        await node.connect(b.listen)
        await node.connect(c.listen)
        await to_owner.send(
            "handoff.chaos.Issue", {"id": 7, "bytes": 48 * MIB, "to": "b", "forward_to": "c", "leak": False}
        )
        got = await reports(node, 7, finished("c"), timeout=60)
        outcome = {r["node"]: r["outcome"] for r in got if r["outcome"] not in ("received", "issued")}
        assert outcome == {"b": "forwarded", "c": "ok"}, got
        # c released its hold: the owner keeps no lease.
        assert await eventually(lambda: _leases(rust_stats, owner.listen), timeout=10) == "none"


async def _leases(rust_stats, addr: str) -> str | bool:
    stats = await rust_stats(addr)
    return "none" if stats["ticket_leases"]["count"] == 0 else False


async def test_a_partition_during_a_pull_ends_in_owner_lost_and_the_lease_by_its_deadline(
    lab, spawn_node, rust_stats, secret
):
    # A slow link to the owner's host, so that the pull is still running when the link goes down.
    lab.shape(2, "--rate", "80mbit")
    try:
        owner = await spawn_node(2, "owner", "--ticket-threshold", "1", "--lease-ttl-ms", "2000")
        b = await spawn_node(3, "b", "--redeem", "lazy", "--pull-timeout-ms", "3000", "--connect", owner.listen)
        async with Node("chaos", secret=secret, listen=f"{lab.hosts[1]}:0") as node:
            to_owner = await node.connect(owner.listen)
            await node.connect(b.listen)
            await to_owner.send(
                "handoff.chaos.Issue", {"id": 1, "bytes": 64 * MIB, "to": "b", "forward_to": None, "leak": False}
            )
            await reports(node, 1, lambda got: any(r["outcome"] == "received" for r in got), timeout=30)
            await asyncio.sleep(0.3)  # the pull is under way: 64 MiB take about 7 s at 80 Mbit/s
            lab.link(2, "down")
            started = time.monotonic()
            try:
                got = await reports(node, 1, finished("b"), timeout=15)
            finally:
                lab.link(2, "up")
            took = time.monotonic() - started
            ends = [r for r in got if r["node"] == "b" and r["outcome"] not in ("received", "issued")]
            assert [r["outcome"] for r in ends] == ["owner-lost"], got
            assert took < 3.0 + 2.0, f"owner-lost after {took:.1f} s, the pull timeout is 3 s"
            # The owner, reachable again, has no lease left: it ended by its deadline.
            assert await eventually(lambda: _leases(rust_stats, owner.listen), timeout=10) == "none"

        # After the link came back, the owner serves new transfers: a new holder on host 3
        # (b's own connection to the owner may or may not have outlived the partition).
        lab.shape(2)
        b2 = await spawn_node(3, "b2", "--redeem", "lazy", "--connect", owner.listen)
        async with Node("chaos", secret=secret, listen=f"{lab.hosts[1]}:0") as node:
            to_owner = await node.connect(owner.listen)
            await node.connect(b2.listen)
            await to_owner.send(
                "handoff.chaos.Issue", {"id": 2, "bytes": 16 * MIB, "to": "b2", "forward_to": None, "leak": False}
            )
            got = await reports(node, 2, finished("b2"), timeout=30)
            assert [r["outcome"] for r in got if r["node"] == "b2" and r["outcome"] != "received"] == ["ok"], got
    finally:
        lab.shape(2)


async def test_a_silent_host_fails_its_connections_within_the_tcp_timeout(lab, spawn_node, rust_stats):
    """A peer's host cut off while the connection is idle sends nothing, not even an end of
    stream: a Rust node with `--tcp-timeout` drops it within that timeout (keepalive and
    TCP_USER_TIMEOUT), and one without keeps it. Both wait on host 1 in the same run, so the
    second shows that the timeout, and nothing else, noticed."""
    timeout, slack = 12, 6
    watching = await spawn_node(1, "watching", "--tcp-timeout", f"{timeout}s")
    plain = await spawn_node(1, "plain")
    await spawn_node(2, "far", "--connect", watching.listen, "--connect", plain.listen)

    async def peers(node) -> set[str]:
        return {name for name, _channel in (await rust_stats(node.listen))["peers"]}

    assert await eventually(lambda: _has(peers, watching, "far"), timeout=10)
    assert await eventually(lambda: _has(peers, plain, "far"), timeout=10)
    lab.link(2, "down")
    cut = time.monotonic()
    try:
        while "far" in await peers(watching):
            assert time.monotonic() - cut < timeout + slack, "the silent peer is still connected"
            await asyncio.sleep(0.25)
        took = time.monotonic() - cut
        assert "far" in await peers(plain), "without a TCP timeout the idle connection stays"
    finally:
        lab.link(2, "up")
    assert took > timeout / 2, f"dropped after {took:.1f} s: something other than the timeout noticed"


async def _has(peers, node, name: str) -> bool:
    return name in await peers(node)
