"""Bytes and file descriptors on a connection: a non-blocking socket driven by asyncio.

Asyncio's streams cannot pass file descriptors, so a connection is a plain
non-blocking socket: reads go through a small buffer (headers) or straight into the
destination (frames); on a Unix socket every read is a ``recvmsg`` that also collects
the descriptors that arrive (SCM_RIGHTS), in order, for the message headers to claim
(spec §7.2). Writes of one message happen under a lock so that messages never
interleave; a message's descriptors ride on the ``sendmsg`` that carries the first
byte of its length prefix.
"""

from __future__ import annotations

import array
import asyncio
import collections
import os
import socket
from typing import Optional, Sequence

from .errors import PeerClosed
from .wire import LEN_PREFIX, PREAMBLE_LEN, Limits, WireError, header_length

__all__ = ["Transport", "MAX_FDS_PER_READ", "MAX_PENDING_FDS"]

READ_CHUNK = 64 * 1024
#: Most descriptors accepted with one read (spec §7.2); more is ``bad-shm``.
MAX_FDS_PER_READ = 64
#: Most descriptors waiting to be claimed by headers.
MAX_PENDING_FDS = 1024
_ANC_SPACE = socket.CMSG_SPACE(MAX_FDS_PER_READ * array.array("i").itemsize)
_RECV_FLAGS = getattr(socket, "MSG_CMSG_CLOEXEC", 0)


class Transport:
    """One connection's socket (TCP or Unix stream)."""

    def __init__(self, sock: socket.socket, label: str):
        sock.setblocking(False)
        self.sock = sock
        self.unix = sock.family == socket.AF_UNIX
        self.label = label
        self.loop = asyncio.get_running_loop()
        self._buf = bytearray()
        self._pos = 0
        self.fds: collections.deque = collections.deque()
        self._fd_error: Optional[str] = None
        self.send_lock = asyncio.Lock()
        self.closed = False
        if not self.unix:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    # ------------------------------------------------------------------ reading

    @property
    def buffered(self) -> int:
        """Bytes read from the socket and not consumed yet."""
        return len(self._buf) - self._pos

    def take_fd_error(self) -> Optional[str]:
        e, self._fd_error = self._fd_error, None
        return e

    def take_fds(self, n: int) -> Optional[list]:
        """The next ``n`` received descriptors, in order; ``None`` if fewer arrived."""
        if len(self.fds) < n:
            return None
        return [self.fds.popleft() for _ in range(n)]

    def _collect(self, ancdata, flags) -> None:
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                for fd in fds:
                    if _RECV_FLAGS == 0:
                        os.set_inheritable(fd, False)
                    self.fds.append(fd)
        if flags & getattr(socket, "MSG_CTRUNC", 0):
            self._fd_error = f"a message carried more than {MAX_FDS_PER_READ} descriptors"
        elif len(self.fds) > MAX_PENDING_FDS:
            self._fd_error = f"over {MAX_PENDING_FDS} descriptors arrived that no header claimed"

    async def _readable(self) -> None:
        fut = self.loop.create_future()
        fd = self.sock.fileno()
        self.loop.add_reader(fd, lambda: fut.done() or fut.set_result(None))
        try:
            await fut
        finally:
            self.loop.remove_reader(fd)

    async def _writable(self) -> None:
        fut = self.loop.create_future()
        fd = self.sock.fileno()
        self.loop.add_writer(fd, lambda: fut.done() or fut.set_result(None))
        try:
            await fut
        finally:
            self.loop.remove_writer(fd)

    async def _recv(self, nbytes: int) -> bytes:
        try:
            if not self.unix:
                return await self.loop.sock_recv(self.sock, nbytes)
            while True:
                try:
                    data, anc, flags, _ = self.sock.recvmsg(nbytes, _ANC_SPACE, _RECV_FLAGS)
                except (BlockingIOError, InterruptedError):
                    await self._readable()
                    continue
                self._collect(anc, flags)
                return data
        except (ConnectionError, OSError) as e:
            if self.closed:
                return b""
            raise PeerClosed(f"reading from {self.label}: {e}") from None

    async def _recv_into(self, view: memoryview) -> int:
        try:
            if not self.unix:
                return await self.loop.sock_recv_into(self.sock, view)
            while True:
                try:
                    n, anc, flags, _ = self.sock.recvmsg_into([view], _ANC_SPACE, _RECV_FLAGS)
                except (BlockingIOError, InterruptedError):
                    await self._readable()
                    continue
                self._collect(anc, flags)
                return n
        except (ConnectionError, OSError) as e:
            if self.closed:
                return 0
            raise PeerClosed(f"reading from {self.label}: {e}") from None

    async def _fill(self, n: int, what: str, at_boundary: bool) -> bool:
        """Buffers at least ``n`` bytes; ``False`` at a clean end of stream before any byte."""
        while len(self._buf) - self._pos < n:
            if self._pos:
                del self._buf[: self._pos]
                self._pos = 0
            data = await self._recv(max(READ_CHUNK, n - len(self._buf)))
            if not data:
                if at_boundary and not self._buf:
                    return False
                raise WireError("truncated", f"truncated input: {what} needs {n} bytes, only {len(self._buf)} present")
            self._buf += data
        return True

    def _take(self, n: int) -> bytes:
        out = bytes(self._buf[self._pos : self._pos + n])
        self._pos += n
        if self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        return out

    async def read_preamble(self) -> bytes:
        await self._fill(PREAMBLE_LEN, "preamble", False)
        return self._take(PREAMBLE_LEN)

    async def read_header(self, limits: Limits) -> Optional[bytes]:
        """The next header's bytes (without the prefix), or ``None`` at a clean end of stream."""
        if not await self._fill(LEN_PREFIX, "header length", True):
            return None
        n = header_length(self._buf[self._pos : self._pos + LEN_PREFIX], limits)
        await self._fill(LEN_PREFIX + n, "header", False)
        self._pos += LEN_PREFIX
        return self._take(n)

    async def read_into(self, dest: memoryview, what: str = "frame") -> None:
        """Fills ``dest`` (a writable byte view) with the next ``len(dest)`` bytes of the stream."""
        n = len(dest)
        have = min(n, len(self._buf) - self._pos)
        if have:
            dest[:have] = self._buf[self._pos : self._pos + have]
            self._pos += have
            if self._pos == len(self._buf):
                self._buf.clear()
                self._pos = 0
        pos = have
        while pos < n:
            got = await self._recv_into(dest[pos:])
            if not got:
                raise WireError("truncated", f"truncated input: {what} needs {n} bytes, only {pos} present")
            pos += got

    # ------------------------------------------------------------------ writing

    async def _sendmsg_fds(self, head: memoryview, fds: Sequence[int]) -> int:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
        while True:
            try:
                return self.sock.sendmsg([head], ancillary, getattr(socket, "MSG_NOSIGNAL", 0))
            except (BlockingIOError, InterruptedError):
                await self._writable()

    async def send(self, chunks: Sequence, fds: Sequence[int] = ()) -> None:
        """Writes ``chunks`` (bytes-like, flat byte views) as one message; ``fds`` ride on its first byte."""
        async with self.send_lock:
            if self.closed:
                raise PeerClosed(f"the connection to {self.label} is closed")
            try:
                rest = list(chunks)
                if fds:
                    head = memoryview(rest[0]).cast("B")
                    sent = await self._sendmsg_fds(head, fds)
                    rest[0] = head[sent:]
                for chunk in rest:
                    if len(chunk):
                        await self.loop.sock_sendall(self.sock, chunk)
            except (ConnectionError, OSError) as e:
                raise PeerClosed(f"writing to {self.label}: {e}") from None

    # ------------------------------------------------------------------ closing

    def shutdown(self) -> None:
        """Ends the connection in both directions; the reader sees the end of the stream."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    async def aclose(self) -> None:
        """Closes the socket (after a message being written has finished or failed) and
        every unclaimed descriptor. Only the connection's reader calls this."""
        if self.closed:
            return
        self.shutdown()
        try:
            await asyncio.wait_for(self.send_lock.acquire(), 5)
            locked = True
        except (asyncio.TimeoutError, asyncio.CancelledError):
            locked = False
        self.closed = True
        try:
            fd = self.sock.fileno()
            if fd >= 0:
                self.loop.remove_reader(fd)
                self.loop.remove_writer(fd)
        except (OSError, ValueError, RuntimeError):
            pass
        try:
            self.sock.close()
        except OSError:
            pass
        if locked:
            self.send_lock.release()
        while self.fds:
            try:
                os.close(self.fds.popleft())
            except OSError:
                pass
