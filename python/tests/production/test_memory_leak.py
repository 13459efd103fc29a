"""Issue 25, item 6: a receiver that dies while a large frame for it is copied into a
pooled segment leaves no segment behind, in this process's descriptors or in the host's
shared memory.

The copy runs in a thread (from 8 MiB); here it is made to sleep first, and the receiver
is killed during that sleep, so that the connection's cleanup runs before the copy is
done. Before the fix the send then added its lease to the table the cleanup had already
emptied: nothing ever ended it, and the segment kept its descriptor and its memory."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from handoff import Node
from handoff_pure.pool import Segment, pool

from helpers import eventually

MIB = 1 << 20
SIZE = 256 * MIB

CHILD = """
import asyncio, sys
from handoff import Node

async def main():
    async with Node("child", secret="k", per_connection=True, shm_private=True) as node:
        peer = await node.connect(sys.argv[1])
        await peer.send("t.Hello", {})
        print("connected", flush=True)
        await asyncio.sleep(60)

asyncio.run(main())
"""


def memfds() -> int:
    """This process's descriptors of handoff segments."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += "memfd:handoff-segment" in os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return n


def shmem() -> int:
    """The host's shared memory (``Shmem`` in /proc/meminfo), in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no Shmem in /proc/meminfo")


@pytest.fixture
def copy_waits_for_a_kill(monkeypatch):
    """Copies into pooled segments wait until the test says the receiver is dead."""
    dead = __import__("threading").Event()
    original = Segment.write

    def write(self, data):
        dead.wait(10)
        original(self, data)

    monkeypatch.setattr(Segment, "write", write)
    return dead


@pytest.mark.pure_only(
    "slows the Python implementation's copy thread (handoff_pure.pool.Segment.write); the engine copies inside "
    "its send, and a killed receiver's segments coming back is test_connections' "
    "test_segments_held_by_a_killed_process_come_back_to_the_pool, on both"
)
async def test_a_receiver_killed_during_a_large_copy_leaves_no_segment(copy_waits_for_a_kill):
    pool().clear()
    fds_before, shmem_before = memfds(), shmem()
    accepted: list = []
    data = np.full(SIZE, 3, dtype=np.uint8)
    async with Node(
        "owner", secret="k", listen="127.0.0.1:0", per_connection=True, shm_pool=True, on_accept=accepted.append
    ) as owner:
        child = subprocess.Popen([sys.executable, "-c", CHILD, owner.listen_addr], stdout=subprocess.PIPE)
        try:
            line = await asyncio.get_running_loop().run_in_executor(None, child.stdout.readline)
            assert line.startswith(b"connected")
            # The child's side of the handshake can end before the owner's does.
            assert await eventually(lambda: accepted, timeout=10)
            peer = accepted[0]
            await peer.recv(5)
            assert peer.channel == "shm"
            send = asyncio.ensure_future(peer.send("t.A", {"x": data}))
            await asyncio.sleep(0.2)  # the copy thread is waiting
            child.send_signal(signal.SIGKILL)
            child.wait()
            deadline = time.monotonic() + 5
            while not peer.closed and time.monotonic() < deadline:  # the cleanup ran
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)
            copy_waits_for_a_kill.set()  # now the copy finishes, after the cleanup
            with pytest.raises(Exception):
                await asyncio.wait_for(send, 10)
            assert owner.shm_leases()["count"] == 0
        finally:
            child.kill()
            child.wait()
    del data
    # Nothing is busy; what is idle is given back (as the pool's timer would).
    deadline = time.monotonic() + 5
    while pool().stats()["busy_segments"] and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert pool().stats()["busy_segments"] == 0
    pool().clear()
    # A large segment is let go of on a short-lived thread (handoff_pure.regions.release): its
    # descriptor closes within moments, not necessarily before clear() returns.
    deadline = time.monotonic() + 5
    while memfds() != fds_before and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert memfds() == fds_before
    # The host's shared memory is back (other processes of the machine move it a little:
    # the test asks for less than half the frame's size to be left).
    deadline = time.monotonic() + 15
    while shmem() - shmem_before >= SIZE // 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    maps = [line for line in open("/proc/self/maps") if "handoff-segment" in line]
    assert shmem() - shmem_before < SIZE // 2, maps
