"""The inbox's cost per message: put then get of one envelope, on the engine's inbox
(``handoff.inbox``, the Rust queues of ``handoff_proto::inbox``) and on the reference's
(``handoff_pure.inbox``, the same algorithm in Python), against a bare ``collections.deque``
(append and popleft) measured in the same run as the floor.

    .venv/bin/python bench/inbox.py [--messages 200000] [--rounds 5]

Each figure is the best of ``--rounds`` rounds (the least disturbed by the machine); the
rounds of the three take turns.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import time
from types import SimpleNamespace


async def per_message(kind: str, n: int) -> float:
    """Seconds per put+get of ``n`` messages of one connection on ``kind``."""
    sender = object()
    envs = [SimpleNamespace(sender=sender, charge=1200, seq=i) for i in range(64)]
    if kind == "deque":
        q: collections.deque = collections.deque()
        t = time.perf_counter()
        for i in range(n):
            q.append(envs[i & 63])
            q.popleft()
        return (time.perf_counter() - t) / n
    if kind == "engine":
        from handoff.inbox import Inbox
    else:
        from handoff_pure.inbox import Inbox
    inbox = Inbox(1024)
    t = time.perf_counter()
    for i in range(n):
        inbox.put(envs[i & 63])
        await inbox.get()
    return (time.perf_counter() - t) / n


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    kinds = ("deque", "engine", "reference")
    best = {k: float("inf") for k in kinds}
    for r in range(args.rounds):
        for k in kinds[r % 3 :] + kinds[: r % 3]:
            best[k] = min(best[k], await per_message(k, args.messages))
    floor = best["deque"]
    print(f"put+get of one message, best of {args.rounds} rounds of {args.messages}")
    for k in kinds:
        ratio = "" if k == "deque" else f"  {best[k] / floor:5.1f}x the deque"
        print(f"{k:10s} {best[k] * 1e9:7.0f} ns{ratio}")


if __name__ == "__main__":
    asyncio.run(main())
