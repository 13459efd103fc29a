"""One Dask message from a new comm to a listener of this process, for the comm tests."""

from __future__ import annotations

import asyncio

from distributed.comm import connect, listen


async def send_one(url: str, message) -> tuple:
    """Listens at ``url``, connects, writes ``message`` and waits (10 s at most) for it to
    arrive; returns ``(what arrived or None, the listener's comm, the connecting comm)``,
    both closed. Dask's config is read as it is when called."""
    got: list = []
    accepted: list = []

    async def handler(comm):
        accepted.append(comm)
        try:
            got.append(await comm.read())
        except OSError:
            pass

    listener = listen(url, handler)
    await listener.start()
    try:
        comm = await connect(listener.contact_address)
        await comm.write(message)
        for _ in range(1000):
            if got:
                break
            await asyncio.sleep(0.01)
        await comm.close()
    finally:
        listener.stop()
    return (got[0] if got else None), (accepted[0] if accepted else None), comm
