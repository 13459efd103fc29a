"""A Dask comm listener in a process of its own, for the production comm tests.

``python comm_peer.py SCHEME`` listens on ``SCHEME://127.0.0.1:0`` (Dask's registry picks
the backend: ``tcp`` or ``handoff``), prints its address on a line, and serves each comm:
it reads a message and does what its ``op`` says, to the comm or to its own process:

- ``die``: kills this process (SIGKILL) while the caller waits for an answer;
- ``reset``: closes the comm's TCP socket with ``SO_LINGER`` 0, so the caller gets a
  reset, and exits;
- ``close``: closes the comm (the caller's read sees a clean close);
- ``echo``: writes the message back.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import sys

from distributed.comm import listen


def _tcp_socket(comm) -> socket.socket:
    """The TCP socket under a comm of either scheme (for handoff, a duplicate of the
    connection's descriptor: options set on it are the connection's)."""
    stream = getattr(comm, "stream", None)
    if stream is not None:
        return stream.socket
    return socket.socket(fileno=os.dup(comm.peer.fileno()))


async def _serve(comm) -> None:
    while True:
        try:
            msg = await comm.read()
        except OSError:
            return
        op = msg.get("op")
        if op == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        elif op == "reset":
            sock = _tcp_socket(comm)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            os._exit(0)  # the kernel closes the socket: with linger 0, a reset
        elif op == "close":
            await comm.close()
            return
        else:
            await comm.write(msg)


async def main(scheme: str) -> None:
    listener = listen(f"{scheme}://127.0.0.1:0", _serve)
    await listener.start()
    print(listener.contact_address, flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    import handoff.dask  # noqa: F401  (the backend's configuration defaults)

    asyncio.run(main(sys.argv[1]))
