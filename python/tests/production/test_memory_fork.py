"""Issue 25, item 3: a client that received an array from a same-host worker forks, and
the child reads the array, on ``handoff://`` as on ``tcp://``.

Before the fix received mappings were marked ``MADV_DONTFORK``: the child died of
SIGSEGV on its first read. The program also says where the array lies, so that the test
knows the handoff run read it in a received shared mapping (not a copy)."""

from __future__ import annotations

import pytest

pytest.importorskip("distributed")

PROGRAM = """
import hashlib, json, multiprocessing, sys

import numpy as np
from distributed import Client, LocalCluster
from handoff.memregion import region_of


def make():
    return np.random.default_rng(7).integers(0, 255, 8 << 20, dtype=np.uint8)  # 8 MiB


def child(arr, expect, q):
    q.put(hashlib.sha256(arr.tobytes()).hexdigest() == expect)


if __name__ == "__main__":
    scheme = sys.argv[1]
    with LocalCluster(
        protocol=scheme, n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster, Client(cluster, direct_to_workers=True) as c:
        arr = c.submit(make, pure=False).result(timeout=30)
        expect = hashlib.sha256(make().tobytes()).hexdigest()
        where = region_of(arr)
        ctx = multiprocessing.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(arr, expect, q))
        p.start()
        p.join(30)
        ok = q.get(timeout=5) if p.exitcode == 0 else None
        print(json.dumps({"exitcode": p.exitcode, "ok": ok, "region": where,
                          "parent_ok": hashlib.sha256(arr.tobytes()).hexdigest() == expect}))
"""


def test_a_forked_child_reads_a_received_array_as_on_tcp(run_program):
    got = {scheme: run_program(PROGRAM, scheme, timeout=90) for scheme in ("tcp", "handoff")}
    assert got["tcp"] == {**got["tcp"], "exitcode": 0, "ok": True, "parent_ok": True}
    # The handoff run received the array in shared memory, a segment of the sender's pool or
    # a window of its arena (the case that crashed)...
    assert got["handoff"]["region"].startswith(("/memfd:handoff-segment", "/memfd:handoff-arena")), got["handoff"]
    # ...and its child read it as the tcp run's did.
    assert (got["handoff"]["exitcode"], got["handoff"]["ok"], got["handoff"]["parent_ok"]) == (0, True, True)
