"""Shared by every system script of bench/peers: sizes, repetitions, statistics, reads.

Each system script (``sys_raw.py``, ``sys_handoff.py``, ``sys_dask.py``, ``sys_ray.py``)
measures in its own process and writes one JSON object::

    {"system": "...", "versions": {...}, "transfers": [row...], "rtt": [row...],
     "notes": ["..."], "errors": ["..."]}

A transfer row: ``{"series", "system", "route", "read", "bytes", "runs", "median",
"min", "max", "how"}`` (``runs`` in seconds, one per measured repetition; the median,
min and max are computed from them by :func:`row`). An RTT row: the same without
``bytes``/``read`` (seconds per round trip of a 100-byte message).

``route`` is ``same-host`` (two processes on this machine that may share memory) or
``remote`` (separate host identities: the bytes cross a TCP connection). ``read`` is
``none`` (the consumer holds the value, no byte touched), ``sample`` (64 evenly spaced
bytes read) or ``full`` (every byte read once, as 64-bit words).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Callable, Iterable, Optional

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

#: Powers of 4 from 1 KiB to 1 GiB.
DEFAULT_SIZES = [KiB << (2 * i) for i in range(11)]

RTT_BYTES = 100


def parse_size(text: str) -> int:
    """``1024``, ``64K``, ``64KiB``, ``16M``, ``1G`` (powers of 1024)."""
    t = text.strip().lower()
    for suffix, shift in (("kib", 10), ("mib", 20), ("gib", 30), ("kb", 10), ("mb", 20), ("gb", 30)):
        if t.endswith(suffix):
            return int(t[: -len(suffix)]) << shift
    for suffix, shift in (("k", 10), ("m", 20), ("g", 30), ("b", 0)):
        if t.endswith(suffix):
            return int(t[:-1]) << shift
    return int(t)


def size_label(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def size_arg(n: int) -> str:
    """The compact form ``handoff bench --sizes`` takes (``64K``)."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


class RepsPolicy:
    """How many measured repetitions (after one warm-up) a size gets.

    Default: 15 up to 1 MiB (where the subtracted overheads of Dask and Ray are noisy),
    9 up to 16 MiB, 5 up to 256 MiB, 3 above. ``fixed`` sets one count for every size.
    """

    def __init__(self, fixed: Optional[int] = None, quick: bool = False):
        self.fixed = fixed
        self.quick = quick

    def __call__(self, size: int) -> int:
        if self.fixed:
            return self.fixed
        if self.quick:
            return 5 if size <= MiB else 3
        if size <= MiB:
            return 15
        if size <= 16 * MiB:
            return 9
        if size <= 256 * MiB:
            return 5
        return 3

    def to_arg(self) -> str:
        return f"fixed:{self.fixed}" if self.fixed else ("quick" if self.quick else "default")

    @staticmethod
    def from_arg(text: str) -> "RepsPolicy":
        if text.startswith("fixed:"):
            return RepsPolicy(fixed=int(text.split(":", 1)[1]))
        return RepsPolicy(quick=text == "quick")


def common_args(description: str) -> argparse.ArgumentParser:
    """The arguments every system script takes from the driver."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--sizes", required=True, help="comma-separated sizes (1K,64K,1M,…)")
    p.add_argument("--reps", default="default", help="repetition policy: default, quick or fixed:N")
    p.add_argument("--rtt-reps", type=int, default=7, help="repetitions of each round-trip measurement")
    p.add_argument("--out", required=True, help="where to write the JSON result")
    return p


def parse_common(args) -> tuple[list, RepsPolicy]:
    return [parse_size(s) for s in args.sizes.split(",") if s], RepsPolicy.from_arg(args.reps)


def row(series: str, system: str, route: str, read: Optional[str], nbytes: Optional[int], runs: list, how: str) -> dict:
    """A result row with its statistics (seconds)."""
    runs = [float(r) for r in runs]
    out = {"series": series, "system": system, "route": route}
    if read is not None:
        out["read"] = read
    if nbytes is not None:
        out["bytes"] = nbytes
    out.update(
        {
            "runs": runs,
            "median": statistics.median(runs) if runs else None,
            "min": min(runs) if runs else None,
            "max": max(runs) if runs else None,
            "how": how,
        }
    )
    return out


def write_result(path: str, result: dict) -> None:
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


def log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


# --- reads, the same in every consumer -------------------------------------------------


def read_sample(a) -> int:
    """Reads 64 evenly spaced bytes of a numpy uint8 array (or any buffer)."""
    import numpy as np

    a = np.frombuffer(a, dtype=np.uint8) if not isinstance(a, np.ndarray) else a
    n = a.shape[0]
    step = max(1, n // 64)
    return int(a[::step][:64].sum(dtype=np.uint64))


def read_full(a) -> int:
    """Reads every byte once (a sum of 64-bit words, wrapping), as fast as numpy reads."""
    import numpy as np

    a = np.frombuffer(a, dtype=np.uint8) if not isinstance(a, np.ndarray) else a
    n = a.shape[0] // 8 * 8
    total = int(a[:n].view(np.uint64).sum(dtype=np.uint64)) if n else 0
    return total + int(a[n:].sum(dtype=np.uint64))


def pattern(n: int, seed: int):
    """``n`` bytes that do not compress (a random 1 MiB block, repeated), as a numpy array."""
    import numpy as np

    block = np.random.default_rng(seed).integers(0, 256, size=min(n, MiB), dtype=np.uint8)
    if n <= MiB:
        return block
    out = np.empty(n, dtype=np.uint8)
    for off in range(0, n, MiB):
        m = min(MiB, n - off)
        out[off : off + m] = block[:m]
    return out


def round_trips(one: Callable[[], None], reps: int, target_seconds: float = 0.2) -> tuple[list, int]:
    """Mean seconds per round trip of ``one()`` over a batch, ``reps`` times.

    The batch size is chosen from a warm-up so that each repetition takes about
    ``target_seconds`` (20 to 2000 round trips). Returns (per-repetition means, batch).
    """
    t = time.perf_counter()
    for _ in range(20):
        one()
    est = (time.perf_counter() - t) / 20
    batch = int(min(2000, max(20, target_seconds / max(est, 1e-9))))
    runs = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(batch):
            one()
        runs.append((time.perf_counter() - t) / batch)
    return runs, batch


async def round_trips_async(one, reps: int, target_seconds: float = 0.2) -> tuple[list, int]:
    """:func:`round_trips` for a coroutine function."""
    t = time.perf_counter()
    for _ in range(20):
        await one()
    est = (time.perf_counter() - t) / 20
    batch = int(min(2000, max(20, target_seconds / max(est, 1e-9))))
    runs = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(batch):
            await one()
        runs.append((time.perf_counter() - t) / batch)
    return runs, batch


def versions(mods: Iterable[str]) -> dict:
    """Installed versions of the named distributions."""
    from importlib import metadata

    out = {}
    for m in mods:
        try:
            out[m] = metadata.version(m)
        except metadata.PackageNotFoundError:
            out[m] = None
    return out
