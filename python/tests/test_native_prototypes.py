"""handoff._native's prototypes (issue 27, item 2): frames cross whole, and a peer's bad
frame fails only its own channel, with an error that says what was wrong."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time

import pytest

native = pytest.importorskip("handoff._native")


async def _read_all(channel, fd: int, want: int):
    loop = asyncio.get_running_loop()
    got, ready = [], asyncio.Event()

    def readable():
        try:
            out = channel.read_frames()
        except (ConnectionError, ValueError) as e:
            got.append(e)
            ready.set()
            return
        if out is None:
            got.append("eof")
        else:
            got.extend(out[0])
            if out[2]:  # more frames are staged: the socket may not say so
                loop.call_soon(readable)
        if len(got) >= want or out is None:
            ready.set()

    loop.add_reader(fd, readable)
    try:
        await asyncio.wait_for(ready.wait(), 10)
    finally:
        loop.remove_reader(fd)
    return got


async def test_loop_channel_frames_cross_whole():
    a, b = socket.socketpair()
    channel = native.LoopChannel(a.detach())
    big = bytes(range(256)) * 400  # 100 KiB: read straight into a bytearray, and within the socket buffer
    for data in (b"hello", b"", big):
        b.sendall(len(data).to_bytes(4, "big") + data)
    got = await _read_all(channel, channel.fileno(), 3)
    assert got == [b"hello", b"", bytearray(big)]
    assert channel.send(b"back")
    assert b.recv(8) == b"\x00\x00\x00\x04back"
    b.close()


async def test_a_frame_over_the_bound_is_refused_before_allocation():
    a, b = socket.socketpair()
    channel = native.LoopChannel(a.detach(), max_frame=1000)
    b.sendall((1 << 31).to_bytes(4, "big"))
    got = await _read_all(channel, channel.fileno(), 1)
    assert isinstance(got[0], ValueError) and "limit is 1000" in str(got[0])
    b.close()


async def test_an_end_inside_a_frame_is_a_connection_error():
    a, b = socket.socketpair()
    channel = native.LoopChannel(a.detach())
    b.sendall((10).to_bytes(4, "big") + b"abc")
    b.close()
    got = await _read_all(channel, channel.fileno(), 1)
    assert isinstance(got[0], ConnectionError) and "inside a frame" in str(got[0])


async def test_thread_channel_delivers_on_the_loop_and_reports_the_end():
    a, b = socket.socketpair()
    loop = asyncio.get_running_loop()
    got, done = [], asyncio.Event()

    def on_frames(arg):
        got.append(arg)
        if isinstance(arg, str):
            done.set()

    channel = native.ThreadChannel(a.detach(), loop, on_frames)
    b.sendall((3).to_bytes(4, "big") + b"abc")
    channel.send(b"xy")
    assert b.recv(6) == b"\x00\x00\x00\x02xy"
    b.close()
    await asyncio.wait_for(done.wait(), 10)
    assert [f for batch in got[:-1] for f in batch] == [b"abc"] and got[-1] == "eof"
    channel.close()


async def test_one_read_returns_a_bounded_number_of_frames():
    """A peer that sends many empty frames at once gets them delivered in capped batches."""
    a, b = socket.socketpair()
    channel = native.LoopChannel(a.detach())
    count = 5 * native.FRAMES_PER_CALL + 7
    b.sendall(b"\x00\x00\x00\x00" * count)
    await asyncio.sleep(0.05)
    frames, off_loop, more = channel.read_frames()
    assert len(frames) == native.FRAMES_PER_CALL and more and not off_loop
    total = len(frames)
    while more:  # the rest is staged in the channel, the socket has nothing more
        frames, off_loop, more = channel.read_frames()
        assert len(frames) <= native.FRAMES_PER_CALL and set(frames) <= {b""}
        total += len(frames)
    assert total == count
    b.close()


def test_send_keeps_a_bounded_backlog_for_a_peer_that_reads_nothing():
    a, b = socket.socketpair()
    channel = native.LoopChannel(a.detach())
    frame = bytes(1 << 20)
    with pytest.raises(BufferError) as refused:
        for _ in range(4 * native.MAX_UNSENT // len(frame)):
            channel.send(frame)
    waiting = int(re.match(r"(\d+) bytes wait", str(refused.value)).group(1))
    assert 0 < waiting <= native.MAX_UNSENT
    b.close()


async def test_thread_channel_stops_reading_while_the_loop_takes_nothing():
    """Backpressure: a busy loop holds at most the bound (plus one batch) of what a fast
    peer sent; the rest waits in the kernel, and all of it arrives once the loop takes it."""
    a, b = socket.socketpair()
    loop = asyncio.get_running_loop()
    got, done = [], asyncio.Event()
    frame = bytes(32 * 1024)
    count = 4 * native.MAX_UNDELIVERED // len(frame)

    def on_frames(arg):
        if isinstance(arg, str):
            done.set()
        else:
            got.extend(arg)
            if len(got) == count:
                done.set()

    channel = native.ThreadChannel(a.detach(), loop, on_frames)
    sender = threading.Thread(target=b.sendall, args=((len(frame).to_bytes(4, "big") + frame) * count,))
    sender.start()
    time.sleep(1.5)  # the loop takes nothing meanwhile
    held = channel.undelivered()
    assert native.MAX_UNDELIVERED // 2 < held <= native.MAX_UNDELIVERED + (320 << 10)
    await asyncio.wait_for(done.wait(), 30)
    sender.join(10)
    assert len(got) == count and channel.undelivered() == 0
    channel.close()
    b.close()
