"""A process that holds many received shared-memory frames holds few descriptors for them
(issue 40: 10,000 frames, at most 64 descriptors): a mapping is known by its segment's
identity (device, inode), not by an open descriptor, on the engine (its mapping cache) and in
the Python implementation alike."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys

from handoff import Node

FRAMES = 10_000
SIZE = 4096

# A sender in a process of its own (its pool's descriptors are not this process's): it
# answers each request with one frame of SIZE bytes, over shared memory.
_SENDER = """
import asyncio, sys
from handoff import Buffer, Node

async def main():
    async with Node("sender", secret="k", shm_threshold=%d) as node:
        peer = await node.connect(sys.argv[1])
        print(peer.channel, flush=True)
        while True:
            env = await peer.recv(60) if node.per_connection else await node.recv(60)
            i = env.body["i"]
            if i < 0:
                break
            await peer.send("t.F", {"i": i, "d": Buffer(i.to_bytes(4, "little") * (%d // 4))})

asyncio.run(main())
""" % (SIZE, SIZE)


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_ten_thousand_held_frames_hold_at_most_64_descriptors():
    async with Node("holder", secret="k", listen="127.0.0.1:0", per_connection=True, on_accept=lambda p: None) as rx:
        child = subprocess.Popen([sys.executable, "-c", _SENDER, rx.listen_addr], stdout=subprocess.PIPE)
        try:
            line = await asyncio.get_running_loop().run_in_executor(None, child.stdout.readline)
            assert line.strip() == b"shm", line
            peer = await rx.wait_for_peer("sender", channel="shm")
            before = _descriptors()
            held = []
            for i in range(FRAMES):
                await peer.send("t.Ask", {"i": i})
                env = await peer.recv(30)
                assert env.frames[0].kind == "shm" and env.body["i"] == i
                held.append(env.body["d"])
                env.frames = []  # the view alone keeps the frame
            assert bytes(held[1234][:4]) == (1234).to_bytes(4, "little")
            grown = _descriptors() - before
            assert grown <= 64, f"{FRAMES} held frames hold {grown} more descriptors"
            del held
            gc.collect()
            await peer.send("t.Ask", {"i": -1})
        finally:
            child.kill()
            child.wait()
