"""Issue 25, item 4: a comm whose peer died, reset or closed raises what Dask's TCP comm
raises, so that Dask takes it for a network failure (it retries, or recomputes what the
peer held) and not for the task's error.

The same program runs on ``tcp://`` and ``handoff://``: a peer in a process of its own
(``comm_peer.py``) is asked to die (SIGKILL), to reset the connection, or to close it,
while this side waits for its answer; then this side writes again. What the read and the
write raise — the class, the class of its ``__cause__`` and its errno, and what Dask's
error messages turn it into on the way to a client — must be what ``tcp://`` raises.
The reset runs on handoff with shared memory off (a TCP connection, as between hosts):
a Unix socket has no reset to give.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dask
import pytest
from distributed.comm import connect
from distributed.core import clean_exception, error_message

PEER = Path(__file__).with_name("comm_peer.py")
SECRET = "production comm test secret"


def _start_peer(scheme: str, shm: bool) -> tuple[subprocess.Popen, str]:
    env = os.environ | {
        "DASK_DISTRIBUTED__COMM__HANDOFF__SECRET": SECRET,
        "DASK_DISTRIBUTED__COMM__HANDOFF__SHM": "true" if shm else "false",
    }
    proc = subprocess.Popen(
        [sys.executable, str(PEER), scheme], env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    )
    address = proc.stdout.readline().strip()
    assert address.startswith(scheme + "://"), f"the peer did not start: {address!r}"
    return proc, address


def _shape(exc: BaseException) -> tuple:
    """What Dask's code can see of an exception a comm raised."""
    cause = exc.__cause__
    return (
        type(exc).__name__,
        isinstance(exc, OSError),
        type(cause).__name__ if cause is not None else None,
        isinstance(cause, OSError),
        getattr(cause, "errno", None),
    )


def _as_a_client_sees_it(exc: BaseException) -> str:
    """The class of ``exc`` after Dask's error message (a worker to a client) and back."""
    try:
        raise exc
    except BaseException as e:
        msg = error_message(e)
    # What travels is the pickled exception (its causes too); the client unpickles it.
    _, value, _ = clean_exception(msg["exception"].data)
    return type(value).__name__


async def _what_it_raises(scheme: str, op: str, shm: bool) -> dict:
    proc, address = _start_peer(scheme, shm)
    try:
        with dask.config.set({"distributed.comm.handoff.secret": SECRET, "distributed.comm.handoff.shm": shm}):
            comm = await connect(address)
            try:
                await comm.write({"op": "echo", "x": 1})
                assert (await comm.read())["x"] == 1
                await comm.write({"op": op})
                with pytest.raises(OSError) as read:
                    await comm.read()
                with pytest.raises(OSError) as write:
                    await comm.write({"op": "echo", "x": 2})
                closed_after = comm.closed()
            finally:
                comm.abort()
    finally:
        proc.kill()
        proc.wait()
    return {
        "read": _shape(read.value),
        "write": _shape(write.value),
        "closed": closed_after,
        "read, as a client sees it": _as_a_client_sees_it(read.value),
    }


@pytest.mark.parametrize(
    "op, shm",
    [("die", True), ("close", True), ("die", False), ("reset", False)],
    ids=["died-same-host", "closed-same-host", "died-over-tcp", "reset-over-tcp"],
)
async def test_a_lost_peer_raises_what_tcp_raises(op, shm):
    tcp = await _what_it_raises("tcp", op, shm)
    handoff = await _what_it_raises("handoff", op, shm)
    assert tcp["read"][0] == "CommClosedError" and tcp["read"][3], tcp  # what Dask takes for a lost peer
    assert handoff == tcp
