"""Transport.send_now: a whole message written from the caller, in order with later sends."""

from __future__ import annotations

import asyncio
import socket

from handoff_pure.transport import Transport


async def _read_all(sock: socket.socket, n: int) -> bytes:
    loop = asyncio.get_running_loop()
    got = bytearray()
    while len(got) < n:
        chunk = await loop.sock_recv(sock, n - len(got))
        assert chunk, "the connection ended early"
        got += chunk
    return bytes(got)


async def test_send_now_writes_at_once_when_nothing_else_is_being_written():
    a, b = socket.socketpair()
    b.setblocking(False)
    t = Transport(a, "pair")
    assert t.send_now(b"hello")
    assert await _read_all(b, 5) == b"hello"
    async with t.send_lock:  # another write in progress: not now
        assert not t.send_now(b"later")
    a.close()
    b.close()


async def test_what_the_socket_does_not_take_is_written_before_the_next_message():
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    b.setblocking(False)
    t = Transport(a, "pair")
    big = bytes(range(256)) * 4096  # 1 MiB: more than the socket takes at once
    assert t.send_now(big)
    assert t._tail is not None, "the socket took it all: the test needs a smaller buffer"
    assert not t.send_now(b"x"), "a message behind a tail must wait its turn"
    sent = asyncio.ensure_future(t.send([b"after"]))
    got = await _read_all(b, len(big) + 5)
    await sent
    assert got == big + b"after"
    assert t._tail is None
    a.close()
    b.close()


async def test_send_now_on_a_closed_connection_writes_nothing():
    a, b = socket.socketpair()
    t = Transport(a, "pair")
    t.shutdown()
    assert not t.send_now(b"x")
    a.close()
    b.close()


async def test_send_now_does_not_overtake_a_sender_waiting_for_the_lock():
    a, b = socket.socketpair()
    b.setblocking(False)
    t = Transport(a, "pair")
    await t.send_lock.acquire()
    waiting = asyncio.ensure_future(t.send([b"first"]))
    await asyncio.sleep(0)  # it waits for the lock
    t.send_lock.release()  # released: the waiter is woken but has not run yet
    assert not t.send_now(b"second"), "it would overtake the waiting sender"
    await waiting
    assert t.send_now(b"third")
    assert await _read_all(b, 10) == b"firstthird"
    a.close()
    b.close()
