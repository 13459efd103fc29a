"""SpilledFile inside Dask (handoff.dask.serialize): a task's SpilledFile read by another
worker's task — its path to a same-host worker process, mapped in place; its bytes to a
worker with another host id, and on tcp://; the object itself in one process — and the
pins a killed worker held end."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import time

import dask
import handoff.dask
import pytest
from distributed import Client, Nanny, Scheduler
from distributed.protocol import deserialize, serialize
from distributed.utils_test import gen_cluster, gen_test
from handoff import Node, PinBounds, SpilledFile
from handoff.dask.serialize import dumps
from handoff.memregion import region_of

SECRET = {"distributed.comm.handoff.secret": "dask test secret"}
SIZE = 1 << 20


def _data() -> bytes:
    return bytes(range(256)) * (SIZE // 256)


def _make() -> SpilledFile:
    return SpilledFile.write(_data())


def _inspect(f: SpilledFile) -> dict:
    view = f.view()
    return {
        "origin": f.origin,
        "in_place": region_of(view) == f.path,
        "digest": hashlib.sha256(view).hexdigest(),
        "pinned": f.pin is not None,
    }


def _path(f: SpilledFile) -> str:
    return f.path


def _keep(f: SpilledFile) -> SpilledFile:
    return f


def _pins() -> int:
    return handoff.dask.stats()["pins"]["count"]


DIGEST = hashlib.sha256(_data()).hexdigest()


def test_the_family_encodes_by_the_route_in_the_context_and_falls_back_to_bytes(tmp_path):
    f = SpilledFile.write(b"x" * 5000, dir=tmp_path)
    with pytest.raises(NotImplementedError):
        dumps(42)
    header, frames = dumps(f)  # no context: as for a remote peer
    assert header["h"] == {"form": "bytes", "size": 5000} and bytes(frames[0]) == b"x" * 5000
    # Through Dask: dispatched by the dask family (first in the default list), or named.
    for serializers in (None, ["handoff"]):
        h, fr = serialize(f, serializers=serializers, context={"sender": {}, "recipient": {}})
        g = deserialize(h, fr)
        assert g.origin == "bytes" and g.read() == b"x" * 5000

    async def bounded():
        async with Node("w", secret="s", pins=PinBounds(max_pins_per_peer=1)) as node:
            peer = {"node": "f" * 32, "name": "other", "host": node.host_id, "proc": "p", "lang": "python"}
            local = {"node": node.node_id, "name": node.name, "host": node.host_id, "proc": node.process_id}
            ctx = {"handoff": {"local": local, "peer": peer, "locality": "same-host", "channel": "shm"}}
            first, _ = dumps(f, context=ctx)
            second, frames = dumps(f, context=ctx)  # over the bound: the bytes, not a failure
            return first["h"]["form"], second["h"]["form"], len(frames), node.pins.count()

    assert asyncio.run(bounded()) == ("path", "bytes", 1, 1)


@gen_cluster(client=True, scheduler_kwargs={"protocol": "handoff"}, config=SECRET, timeout=120)
async def test_in_one_process_a_task_gets_the_object_itself(c, s, a, b):
    assert a.address.startswith("handoff://")
    x = c.submit(_make, workers=[a.address], pure=False)
    got = await c.submit(_inspect, x, workers=[b.address], pure=False)
    assert got == {"origin": "local", "in_place": True, "digest": DIGEST, "pinned": False}


@gen_cluster(client=True, timeout=120)
async def test_on_tcp_it_travels_as_bytes(c, s, a, b):
    assert a.address.startswith("tcp://")
    x = c.submit(_make, workers=[a.address], pure=False)
    got = await c.submit(_inspect, x, workers=[b.address], pure=False)
    assert got == {"origin": "bytes", "in_place": False, "digest": DIGEST, "pinned": False}


async def _until(check, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.1)


@gen_test(timeout=240)
async def test_between_worker_processes_path_on_one_host_bytes_to_another_and_a_killed_holder_ends_its_pins(
    monkeypatch,
):
    # The scheduler and the client (this process) share host-one with two of the workers.
    monkeypatch.setenv("HANDOFF_HOST_ID", "host-one")
    # Without the active memory manager: it drops replicas it finds redundant, and once
    # the far worker holds x too it may drop a's (then a deletes the file, rightly, and
    # nothing here could tell a file kept for its owner from one kept for nobody).
    no_amm = {"distributed.scheduler.active-memory-manager.start": False}
    with dask.config.set({**SECRET, **no_amm}):
        async with Scheduler(protocol="handoff", host="127.0.0.1", dashboard_address=":0") as s:
            async with (
                Nanny(s.address, nthreads=1, env={"HANDOFF_HOST_ID": "host-one"}) as n1,
                Nanny(s.address, nthreads=1, env={"HANDOFF_HOST_ID": "host-one"}) as n2,
                Nanny(s.address, nthreads=1, env={"HANDOFF_HOST_ID": "host-two"}) as n3,
            ):
                async with Client(s.address, asynchronous=True) as c:
                    await c.wait_for_workers(3)
                    a, b, far = n1.worker_address, n2.worker_address, n3.worker_address
                    x = c.submit(_make, workers=[a], pure=False)
                    path = await c.submit(_path, x, workers=[a], pure=False)
                    near = await c.submit(_inspect, x, workers=[b], pure=False)
                    assert near == {"origin": "path", "in_place": True, "digest": DIGEST, "pinned": True}
                    remote = await c.submit(_inspect, x, workers=[far], pure=False)
                    assert remote == {"origin": "bytes", "in_place": False, "digest": DIGEST, "pinned": False}

                    # b keeps the file it received as its own result: a keeps the file for it.
                    y = c.submit(_keep, x, workers=[b], pure=False)
                    await y
                    assert (await c.run(_pins, workers=[a]))[a] >= 1
                    pid = (await c.run(os.getpid, workers=[b]))[b]
                    os.kill(pid, signal.SIGKILL)

                    async def ended():
                        return (await c.run(_pins, workers=[a]))[a] == 0

                    assert await _until(ended), "the killed worker's pins did not end"
                    assert os.path.exists(path)  # a still has x
                    del x, y

                    async def deleted():
                        return not os.path.exists(path)

                    assert await _until(deleted), "the owner did not delete the file once everyone was done"

                    # Client.gather goes through the scheduler, which forwards what a sent it
                    # without decoding it: the client (same host) maps the path, holding no pin.
                    z = c.submit(_make, workers=[a], pure=False)
                    got = await z
                    assert got.origin == "path" and got.pin is None
                    assert hashlib.sha256(got.view()).hexdigest() == DIGEST
