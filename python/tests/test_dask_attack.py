"""A real Dask cluster on handoff:// with a secret, attacked by a peer without it (spec §5.6–§5.8).

``dask scheduler`` and ``dask worker`` processes share a cluster secret (as
``DASK_DISTRIBUTED__COMM__HANDOFF__SECRET``). An attacker opens raw connections to them
and crosses their challenges, within one node and across the two, and tries version 2:
each connection fails inside handoff's handshake, before anything of Dask's is read or
sent — the attacker gets a preamble, a challenge and an ``error``, never an ``ident``, a
``ready`` or a message (so Dask's own comm handshake never starts) — while a legitimate
``Client`` computes on the cluster meanwhile.
"""

from __future__ import annotations

import asyncio
import os
import secrets

import dask
from attacker import Wire, challenge_of, opened
from distributed import Client
from distributed.utils_test import gen_test
from handoff_pure import wire
from helpers import dask_cli, start_dask_scheduler, stop_processes

SECRET = {"distributed.comm.handoff.secret": "dask attack secret"}


def tcp(address: str) -> str:
    return "tcp://" + address[len("handoff://") :]


def crossed(a_addr: str, b_addr: str) -> list:
    """Two connections, their challenges crossed, then a made-up proof on each."""
    a, b = opened(a_addr), opened(b_addr)
    ca, cb = challenge_of(a), challenge_of(b)
    a.send_header(cb)
    b.send_header(ca)
    for w in (a, b):
        assert w.nothing_for(0.3), f"an acceptor sent {w.kinds()} before it verified a proof"
        w.send(wire.encode_message(wire.Auth(secrets.token_bytes(32))))
        w.read_to_end()
    return [a, b]


def v2_only(addr: str) -> list:
    w = Wire(addr)
    w.send(wire.V2_DEFAULT.encode())
    w.read_preamble()
    w.read_to_end()
    return [w]


def attacks(scheduler: str, worker: str) -> list:
    out = []
    for _ in range(3):
        out += crossed(scheduler, scheduler)
        out += crossed(scheduler, worker)
        out += v2_only(scheduler) + v2_only(worker)
    return out


@gen_test(timeout=240)
async def test_a_dask_cluster_with_a_secret_refuses_an_attacker_and_serves_its_client(tmp_path):
    env = {**os.environ, "DASK_DISTRIBUTED__COMM__HANDOFF__SECRET": SECRET["distributed.comm.handoff.secret"]}
    scheduler, address = await start_dask_scheduler(tmp_path, env)
    procs = [scheduler]
    try:
        worker_args = ("--nthreads", "1", "--no-dashboard", "--no-nanny")
        procs.append(dask_cli("worker", address, *worker_args, env=env, log=tmp_path / "w.log"))
        with dask.config.set(SECRET):
            async with Client(address, asynchronous=True) as c:
                await c.wait_for_workers(1, timeout=120)
                (worker,) = list(c.scheduler_info()["workers"])
                task = asyncio.ensure_future(asyncio.to_thread(attacks, tcp(address), tcp(worker)))
                computed = 0
                while not task.done():
                    assert await c.submit(sum, range(computed + 10), pure=False) == sum(range(computed + 10))
                    computed += 1
                    await asyncio.sleep(0.05)
                conns = await task
                assert computed >= 1, "the client computed while the attacks ran"
                assert await c.submit(lambda: 42) == 42
        for w in conns:
            w.assert_unproven("an attacker of the Dask cluster")
            assert w.error_code() in ("auth-failed", "unsupported-version"), (w.kinds(), w.error_code())
            assert b"handshake-info" not in w.received and b"compression" not in w.received
        assert {w.error_code() for w in conns} == {"auth-failed", "unsupported-version"}
    finally:
        stop_processes(procs)
