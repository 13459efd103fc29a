"""Two processes of one host passing device memory (spec §7.10), for test_cuda.py.

Run with ``HANDOFF_CUDA_EMULATE=1`` where there is no GPU (the emulated driver: host memory
plays device memory, so this checks handoff's side: naming, mapping, pulling, releasing,
and the owner freeing its memory), or on a GPU as it is. The owner (this process) starts
the receiver, sends it device frames three ways, and prints what it saw as JSON:

- ``ipc``: the receiver maps the owner's memory, checks its bytes and drops it; the owner's
  memory goes back once it did;
- ``pull``: the receiver refuses to map (``HANDOFF_CUDA_IPC=0``), pulls the bytes and puts
  them on its own device; the owner's memory goes back as soon as the pull is done;
- ``killed``: the receiver maps and holds an array, the owner kills it (SIGKILL), and its
  memory goes back when the connection ends.

Each way also reports ``max_loop_lag``: the longest the owner's event loop was late to wake
a task that sleeps 5 ms at a time, from the send until the answer. A host copy that a pull
asks for is made off the loop, so a slow copy (the emulated driver's
``HANDOFF_CUDA_EMULATE_DTOH_MS_PER_MIB``) must not show there.

``--reference`` makes the receiver a node of the pure-Python reference, which announces no
``cuda``: every array reaches it as a host copy (``via`` ``host``), a numpy array.

    HANDOFF_CUDA_EMULATE=1 python python/tests/cuda_pair.py [--mib 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time

from handoff import Node
from handoff.native import ext

SECRET = "cuda-pair"


def pattern(seed: int, n: int) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(256)) * (n // 256)


def used_bytes() -> int:
    free, total = ext.cuda_memory_info(0)
    return total - free


async def receiver(addr: str, reference: bool) -> None:
    async with Node("cuda-b", secret=SECRET, engine=not reference) as b:
        peer = await b.connect(addr)
        await peer.send("pair.Hello", {"channel": peer.channel, "caps": list(b.caps)})
        held = []
        while True:
            with await b.recv() as env:
                body = env.body
                if env.type_name == "pair.Way":
                    os.environ["HANDOFF_CUDA_IPC"] = "0" if body["way"] == "pull" else "1"
                    await peer.send("pair.Ready", {})
                    continue
                if env.type_name == "pair.Stop":
                    return
                x = body["x"]
                frame = getattr(x, "frame", x)
                got = x.to_host() if hasattr(x, "to_host") else x.tobytes()
                ok = got == pattern(body["seed"], body["n"])
                via = getattr(frame, "via", "host")
                reply = {"seq": body["seq"], "via": via, "ok": ok, "kind": type(x).__name__}
                hold = body.get("hold", False)
                del body, env
            if hold:
                held.append(x)
            del x, frame
            await peer.send("pair.Got", reply)


async def wait_for(what, limit: float = 10.0) -> float:
    t0 = time.perf_counter()
    while not what():
        if time.perf_counter() - t0 > limit:
            return -1.0
        await asyncio.sleep(0.005)
    return time.perf_counter() - t0


class LoopLag:
    """The longest a task sleeping 5 ms at a time woke late, while it runs."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(0.005)
            self.worst = max(self.worst, time.perf_counter() - t0 - 0.005)

    def stop(self) -> float:
        self._task.cancel()
        return self.worst


async def owner(n: int, reference: bool) -> dict:
    out: dict = {}
    async with Node("cuda-a", secret=SECRET, listen="127.0.0.1:0") as a:
        role = ["--receiver", a.listen_addr] + (["--reference"] if reference else [])
        child = subprocess.Popen([sys.executable, __file__, *role])
        try:
            with await asyncio.wait_for(a.recv(), 60) as hello:
                peer = hello.sender
                out["hello"] = hello.body
            out["owner_caps"] = list(a.caps)
            base = used_bytes()
            for seq, way in enumerate(("ipc", "pull", "killed"), 1):
                await peer.send("pair.Way", {"way": "pull" if way == "pull" else "ipc"})
                (await asyncio.wait_for(a.recv(), 30)).release()
                x = ext.cuda_upload(pattern(seq, n))
                lag = LoopLag()
                await peer.send("pair.Array", {"seq": seq, "seed": seq, "n": n, "x": x, "hold": way == "killed"})
                del x  # only the lease keeps it now
                with await asyncio.wait_for(a.recv(), 30) as got:
                    row = dict(got.body)
                row["max_loop_lag"] = lag.stop()
                if way == "killed":
                    row["held_while_alive"] = used_bytes() - base
                    child.send_signal(signal.SIGKILL)
                row["seconds_to_free"] = await wait_for(lambda: used_bytes() == base)
                out[way] = row
        finally:
            if child.poll() is None:
                child.kill()
            child.wait()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=4)
    p.add_argument("--receiver")
    p.add_argument("--reference", action="store_true", help="the receiver is a pure-Python reference node")
    args = p.parse_args()
    if args.receiver:
        asyncio.run(receiver(args.receiver, args.reference))
        return
    print(json.dumps(asyncio.run(owner(args.mib << 20, args.reference))))


if __name__ == "__main__":
    main()
