"""GPU memory between two processes on one host (spec §7.10, issue 38): a CuPy array sent
by handoff through CUDA IPC, against the copy through the host that other routes take.

The parent is the owner, A: a ``handoff.Node`` on the engine. It starts the receiver, B,
as a child process, which connects to it; the connection switches to the Unix socket, and
both announce ``cuda``. Then, for each way and round, A makes a fresh array of random
bytes on its device (a seeded generator), sends it, and times until B says the array is
on B's device; B then checks every byte on its device against the same generator's output
and says so (not timed). The ways:

- ``ipc``: the array itself; B maps A's memory through its IPC handle (no byte is copied);
- ``pull``: the same, with ``HANDOFF_CUDA_IPC=0`` at B, as where the driver refuses the
  handle: B pulls the bytes from A (a device-to-host copy at A, the Unix socket, a
  host-to-device copy at B), handoff's fallback;
- ``host``: what an application does without §7.10: A copies the array to the host
  (``cupy.asnumpy``) and sends the numpy array (shared memory), B copies it to its device.

The raw baselines, timed in A in the same run: a device-to-device copy of the array, and
its copy through the host (``cupy.asnumpy`` then ``cupy.asarray``) with no process or
socket between. Finally A sends B an array through IPC, B holds it, A kills B
(SIGKILL), and A times how long until its lease ends and the array's memory goes back to
CuPy's pool (the owner frees it).

    python3 bench/gpu_ipc.py [--mib 1024] [--rounds 3] [--json PATH]

Needs CuPy and a CUDA device (``scripts/gpu-check`` runs it on a lent machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "src"))

import cupy  # noqa: E402

from handoff import Bounds, Node  # noqa: E402
from handoff import cuda as handoff_cuda  # noqa: E402

SECRET = "gpu-bench"
#: Room for a whole array in flight per peer (a host copy is buffered until taken).
BOUNDS = Bounds(max_buffered_bytes_per_peer=3 << 30, max_buffered_bytes=6 << 30)


def fresh(seed: int, n: int):
    """``n`` random bytes on the current device, the same for the same seed in any process
    (drawn as 32-bit words: drawing bytes would make a 32-bit temporary of 4n)."""
    return cupy.random.default_rng(seed).integers(0, 2**32, n // 4, dtype=cupy.uint32).view(cupy.uint8)


def via_of(x) -> str:
    """How a received CuPy array came: ``ipc`` (A's memory, mapped) or ``copy`` (pulled and
    put on B's device) for handoff's frames, ``host`` for an array B made itself."""
    frame = getattr(getattr(x.data.mem, "_owner", None), "frame", None)
    return getattr(frame, "via", "host")


async def receiver(addr: str) -> None:
    """B: connects to A, and answers each array: ``gpu.got`` once it is on B's device, then
    ``gpu.checked`` with whether every byte is right."""
    async with Node("gpu-b", secret=SECRET, bounds=BOUNDS) as b:
        peer = await b.connect(addr)
        await peer.send("gpu.hello", {"channel": peer.channel, "caps": list(b.caps)})
        held = []
        while True:
            with await b.recv() as env:
                if env.type_name == "gpu.stop":
                    return
                if env.type_name == "gpu.way":
                    # Set before A sends the array: B maps it (or pulls it) on receipt.
                    os.environ["HANDOFF_CUDA_IPC"] = "0" if env.body["way"] == "pull" else "1"
                    await peer.send("gpu.ready", {})
                    continue
                body = env.body
                x = body["x"]
                if body["way"] == "host":
                    x = cupy.asarray(x)  # the application's copy to its device
                cupy.cuda.runtime.deviceSynchronize()
                await peer.send("gpu.got", {"seq": body["seq"], "type": type(x).__name__, "via": via_of(x)})
            seq, seed, n, hold = body["seq"], body["seed"], body["n"], body.get("hold")
            del body, env  # the array alone holds A's memory now
            if hold:
                held.append(x)  # keeps A's memory mapped until this process dies
                continue
            ok = bool(cupy.array_equal(x, fresh(seed, n)))
            del x  # the hold ends: A may free its array
            await peer.send("gpu.checked", {"seq": seq, "ok": ok})


async def owner(args) -> dict:
    n = args.mib << 20
    results: dict = {"bytes": n, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()}
    async with Node("gpu-a", secret=SECRET, listen="127.0.0.1:0", bounds=BOUNDS) as a:
        child = subprocess.Popen([sys.executable, __file__, "--receiver", a.listen_addr])
        try:
            hello = await asyncio.wait_for(a.recv(), 60)
            with hello:
                peer, said = hello.sender, hello.body
            results["channel"], results["receiver_caps"] = said["channel"], said["caps"]
            results["owner_caps"] = list(a.caps)
            results["ways"] = {}
            seq = 0
            for way in ("ipc", "pull", "host"):
                await peer.send("gpu.way", {"way": way})
                ready = await asyncio.wait_for(a.recv(), 60)
                ready.release()
                times, vias, checked = [], set(), []
                for r in range(args.rounds):
                    seq += 1
                    x = fresh(seq, n)
                    cupy.cuda.runtime.deviceSynchronize()
                    t0 = time.perf_counter()
                    payload = cupy.asnumpy(x) if way == "host" else x
                    await peer.send("gpu.array", {"seq": seq, "seed": seq, "n": n, "way": way, "x": payload})
                    got = await asyncio.wait_for(a.recv(), 120)
                    t1 = time.perf_counter()
                    with got:
                        assert got.type_name == "gpu.got" and got.body["seq"] == seq, got.body
                        vias.add(got.body["via"])
                    del x, payload
                    check = await asyncio.wait_for(a.recv(), 120)
                    with check:
                        checked.append(check.body["ok"])
                    times.append(t1 - t0)
                best = statistics.median(times)
                results["ways"][way] = {
                    "seconds": times,
                    "median_seconds": best,
                    "gb_per_s": n / best / 1e9,
                    "via": sorted(vias),
                    "every_byte_checked_ok": all(checked),
                }
                print(way, results["ways"][way], flush=True)
            results["baselines"] = baselines(n, args.rounds)
            results["killed_receiver"] = await kill_while_held(a, peer, child, n, seq + 1)
        finally:
            if child.poll() is None:
                child.kill()
            child.wait()
    return results


def baselines(n: int, rounds: int) -> dict:
    """The raw copies, in this process: device to device, and through the host."""
    x = fresh(0, n)
    d2d, host = [], []
    for _ in range(rounds):
        cupy.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        y = x.copy()
        cupy.cuda.runtime.deviceSynchronize()
        d2d.append(time.perf_counter() - t0)
        del y
        t0 = time.perf_counter()
        y = cupy.asarray(cupy.asnumpy(x))
        cupy.cuda.runtime.deviceSynchronize()
        host.append(time.perf_counter() - t0)
        del y
    out = {}
    for name, times in (("device_to_device_copy", d2d), ("copy_through_host", host)):
        best = statistics.median(times)
        out[name] = {"seconds": times, "median_seconds": best, "gb_per_s": n / best / 1e9}
    return out


async def kill_while_held(a, peer, child, n: int, seq: int) -> dict:
    """A sends B an array through IPC that B holds; A kills B and times until the memory is
    back in CuPy's pool (the lease ended with B's connection)."""
    pool = cupy.get_default_memory_pool()
    await peer.send("gpu.way", {"way": "ipc"})
    (await asyncio.wait_for(a.recv(), 60)).release()
    x = fresh(seq, n)
    await peer.send("gpu.array", {"seq": seq, "seed": seq, "n": n, "way": "ipc", "x": x, "hold": True})
    got = await asyncio.wait_for(a.recv(), 120)
    with got:
        via = got.body["via"]
    del x  # only the lease keeps it now
    held = pool.used_bytes()
    t0 = time.perf_counter()
    child.send_signal(signal.SIGKILL)
    freed_after = None
    while time.perf_counter() - t0 < 20:
        if pool.used_bytes() <= held - n:
            freed_after = time.perf_counter() - t0
            break
        await asyncio.sleep(0.005)
    return {
        "via": via,
        "pool_bytes_while_held": held,
        "pool_bytes_after": pool.used_bytes(),
        "freed": freed_after is not None,
        "seconds_to_free": freed_after,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=1024, help="array size in MiB (default 1024)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", help="write the results here")
    p.add_argument("--receiver", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.receiver:
        asyncio.run(receiver(args.receiver))
        return
    ok, why = handoff_cuda.status()
    if not ok:
        sys.exit(f"gpu_ipc: {why}")
    results = asyncio.run(owner(args))
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
