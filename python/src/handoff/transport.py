"""Bytes and file descriptors on a connection: a non-blocking socket driven by asyncio.

Asyncio's streams cannot pass file descriptors, so a connection is a plain
non-blocking socket: reads go through a small buffer (headers) or straight into the
destination (frames); on a Unix socket every read is a ``recvmsg`` that also collects
the descriptors that arrive (SCM_RIGHTS), in order, for the message headers to claim
(spec §7.2). Writes of one message happen under a lock so that messages never
interleave; a message's descriptors ride on the ``sendmsg`` that carries the first
byte of its length prefix.

Time is bounded both ways (spec §9.1): inside a message (after its first byte and
before its last) a read that waits longer than ``progress_timeout`` for the next byte
fails with ``timeout``; a write that makes no progress for ``write_timeout`` closes
the connection, so only that peer's sends fail. Closing after an error (§11.3) shuts
down the sending side first and drains what still arrives for a moment, so that the
peer reads our ``error`` instead of a reset.
"""

from __future__ import annotations

import array
import asyncio
import collections
import os
import socket
import time
from typing import Optional, Sequence

from .bounds import DEFAULT_BOUNDS, Bounds
from .errors import PeerClosed
from .wire import LEN_PREFIX, PREAMBLE_LEN, Limits, WireError, header_length

__all__ = ["Transport", "MAX_FDS_PER_READ"]

READ_CHUNK = 64 * 1024
#: Most descriptors accepted with one read (spec §7.2); more is ``bad-shm``.
MAX_FDS_PER_READ = 64
_ANC_SPACE = socket.CMSG_SPACE(MAX_FDS_PER_READ * array.array("i").itemsize)
_RECV_FLAGS = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
_SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(False)


class Transport:
    """One connection's socket (TCP or Unix stream)."""

    def __init__(self, sock: socket.socket, label: str, bounds: Bounds = DEFAULT_BOUNDS):
        sock.setblocking(False)
        self.sock = sock
        self.unix = sock.family == socket.AF_UNIX
        self.label = label
        self.bounds = bounds
        self.loop = asyncio.get_running_loop()
        self._buf = bytearray()
        self._pos = 0
        #: Bytes received from the socket so far (the stream offset of the next byte).
        self._received = 0
        self.fds: collections.deque = collections.deque()
        #: For each descriptor in ``fds``: the stream offset at the end of the read that brought it.
        self._fd_ends: collections.deque = collections.deque()
        self._fd_error: Optional[str] = None
        #: How many times a read waited for the socket (its reader then had no backlog).
        self.read_waits = 0
        self.send_lock = asyncio.Lock()
        #: What :meth:`send_now` could not write at once: written (by a task, or by the
        #: next :meth:`send`) before any later message.
        self._tail: Optional[memoryview] = None
        self._tail_task: Optional[asyncio.Task] = None
        #: Senders in :meth:`send`, holding ``send_lock`` or waiting for it: while there are
        #: any, :meth:`send_now` writes nothing (it would overtake them).
        self._senders = 0
        self._write_waiter: Optional[asyncio.Future] = None
        self._broken: Optional[str] = None
        #: Whether an ``error`` message was sent (the close then drains input first, §11.3).
        self.error_sent = False
        #: The node id this connection's handshake claimed in step 6, until it is registered.
        self.claimed: Optional[str] = None
        #: On a Unix socket: the peer's process id (``SO_PEERCRED``), set by the node.
        self.peer_pid: Optional[int] = None
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

    @property
    def consumed(self) -> int:
        """Stream offset of the next byte a reader will consume."""
        return self._received - self.buffered

    def take_fd_error(self) -> Optional[str]:
        e, self._fd_error = self._fd_error, None
        return e

    def take_fds(self, n: int) -> Optional[list]:
        """The next ``n`` received descriptors, in order; ``None`` if fewer arrived."""
        if len(self.fds) < n:
            return None
        out = []
        for _ in range(n):
            out.append(self.fds.popleft())
            self._fd_ends.popleft()
        return out

    def fds_arrived_by(self, offset: int) -> int:
        """How many waiting descriptors came with reads that ended at or before stream
        ``offset``: they belong to bytes before it (a descriptor rides on the first byte
        of the message that carries it, §7.2)."""
        count = 0
        for end in self._fd_ends:
            if end > offset:
                break
            count += 1
        return count

    def close_fds(self) -> None:
        while self.fds:
            fd = self.fds.popleft()
            try:
                os.close(fd)
            except OSError:
                pass
        self._fd_ends.clear()

    def _collect(self, ancdata, flags) -> None:
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                for fd in fds:
                    if _RECV_FLAGS == 0:
                        os.set_inheritable(fd, False)
                    self.fds.append(fd)
                    self._fd_ends.append(self._received)
        if flags & getattr(socket, "MSG_CTRUNC", 0):
            self._fd_error = f"a message carried more than {MAX_FDS_PER_READ} descriptors"
        elif len(self.fds) > self.bounds.max_pending_fds:
            self._fd_error = f"over {self.bounds.max_pending_fds} descriptors arrived that no header claimed"
            # Keep none of them: the connection is about to fail, and they must not pile up.
            self.close_fds()

    async def _readable(self, timeout: Optional[float], what: str) -> None:
        if self.closed:
            raise PeerClosed(f"the connection to {self.label} is closed")
        self.read_waits += 1
        fut = self.loop.create_future()
        fd = self.sock.fileno()
        self.loop.add_reader(fd, _wake, fut)
        timer = self.loop.call_later(timeout, _expire, fut) if timeout is not None else None
        try:
            ok = await fut
        finally:
            if timer is not None:
                timer.cancel()
            try:
                self.loop.remove_reader(fd)
            except (ValueError, OSError):
                pass
        if ok is False:
            raise WireError(
                "timeout",
                f"timed out: no byte from {self.label} for {timeout:g} s in the middle of a message ({what})",
            )

    def _recv_now(self, nbytes: int) -> bytes:
        if self.unix:
            data, anc, flags, _ = self.sock.recvmsg(nbytes, _ANC_SPACE, _RECV_FLAGS)
            self._received += len(data)
            self._collect(anc, flags)
            return data
        data = self.sock.recv(nbytes)
        self._received += len(data)
        return data

    def _recv_into_now(self, view: memoryview) -> int:
        if self.unix:
            n, anc, flags, _ = self.sock.recvmsg_into([view], _ANC_SPACE, _RECV_FLAGS)
            self._received += n
            self._collect(anc, flags)
            return n
        n = self.sock.recv_into(view)
        self._received += n
        return n

    async def _recv(self, nbytes: int, timeout: Optional[float], what: str) -> bytes:
        try:
            while True:
                try:
                    return self._recv_now(nbytes)
                except (BlockingIOError, InterruptedError):
                    await self._readable(timeout, what)
        except (ConnectionError, OSError) as e:
            if self.closed:
                return b""
            raise PeerClosed(f"reading from {self.label}: {e}") from None

    async def _recv_into(self, view: memoryview, timeout: Optional[float], what: str) -> int:
        try:
            while True:
                try:
                    return self._recv_into_now(view)
                except (BlockingIOError, InterruptedError):
                    await self._readable(timeout, what)
        except (ConnectionError, OSError) as e:
            if self.closed:
                return 0
            raise PeerClosed(f"reading from {self.label}: {e}") from None

    async def _fill(self, n: int, what: str, at_boundary: bool) -> bool:
        """Buffers at least ``n`` bytes; ``False`` at a clean end of stream before any byte.

        Waiting for the first byte of a message (``at_boundary``, nothing buffered) has no
        time limit; every later wait is bounded by the progress timeout."""
        while len(self._buf) - self._pos < n:
            if self._pos:
                del self._buf[: self._pos]
                self._pos = 0
            idle = at_boundary and not self._buf
            timeout = None if idle else self.bounds.progress_timeout
            data = await self._recv(max(READ_CHUNK, n - len(self._buf)), timeout, what)
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

    async def read_length(self, limits: Limits) -> Optional[int]:
        """The next header's length (its prefix checked, §11.2 step 1), or ``None`` at a
        clean end of stream. The header itself is read by :meth:`read_header_body`."""
        if not await self._fill(LEN_PREFIX, "header length", True):
            return None
        n = header_length(self._buf[self._pos : self._pos + LEN_PREFIX], limits)
        self._pos += LEN_PREFIX
        return n

    async def read_header_body(self, n: int) -> bytes:
        await self._fill(n, "header", False)
        return self._take(n)

    async def read_header(self, limits: Limits) -> Optional[bytes]:
        """The next header's bytes (without the prefix), or ``None`` at a clean end of stream."""
        n = await self.read_length(limits)
        if n is None:
            return None
        return await self.read_header_body(n)

    async def read_into(self, dest: memoryview, what: str = "frame", progress=None) -> None:
        """Fills ``dest`` (a writable byte view) with the next ``len(dest)`` bytes of the stream.

        ``progress``, if given, is called with the number of bytes of ``dest`` filled so
        far after each read (its bytes before that never change again)."""
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
            got = await self._recv_into(dest[pos:], self.bounds.progress_timeout, what)
            if not got:
                raise WireError("truncated", f"truncated input: {what} needs {n} bytes, only {pos} present")
            pos += got
            if progress is not None:
                progress(pos)

    async def skip(self, n: int, what: str) -> None:
        """Reads and drops the next ``n`` bytes through a small scratch buffer (nothing allocated for them)."""
        scratch = memoryview(bytearray(min(n, READ_CHUNK) or 1))
        left = n
        while left:
            m = min(left, len(scratch))
            await self.read_into(scratch[:m], what)
            left -= m

    # ------------------------------------------------------------------ writing

    async def _writable(self) -> None:
        if self._broken is not None:
            raise PeerClosed(self._broken)
        fut = self.loop.create_future()
        fd = self.sock.fileno()
        self.loop.add_writer(fd, _wake, fut)
        timeout = self.bounds.write_timeout
        timer = self.loop.call_later(timeout, _expire, fut)
        self._write_waiter = fut
        try:
            ok = await fut
        finally:
            self._write_waiter = None
            timer.cancel()
            try:
                self.loop.remove_writer(fd)
            except (ValueError, OSError):
                pass
        if ok is False:
            self._broken = (
                f"writing to {self.label}: no progress for {timeout:g} s (the peer reads nothing); "
                "the connection is closed"
            )
            self.shutdown()
            raise PeerClosed(self._broken)

    async def _sendall(self, data) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            try:
                sent = self.sock.send(view, _SEND_FLAGS)
            except (BlockingIOError, InterruptedError):
                await self._writable()
                continue
            view = view[sent:]

    async def _sendmsg_fds(self, head: memoryview, fds: Sequence[int]) -> int:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
        while True:
            try:
                return self.sock.sendmsg([head], ancillary, _SEND_FLAGS)
            except (BlockingIOError, InterruptedError):
                await self._writable()

    async def send(self, chunks: Sequence, fds: Sequence[int] = ()) -> None:
        """Writes ``chunks`` (bytes-like, flat byte views) as one message; ``fds`` ride on its first byte.

        Raises :class:`PeerClosed` if the connection is closed, or if the peer reads
        nothing for the write timeout (the connection is then closed)."""
        self._senders += 1
        try:
            await self._send_locked(chunks, fds)
        finally:
            self._senders -= 1

    async def _send_locked(self, chunks: Sequence, fds: Sequence[int]) -> None:
        async with self.send_lock:
            if self.closed or self._broken is not None:
                raise PeerClosed(self._broken or f"the connection to {self.label} is closed")
            try:
                await self._write_tail()
                rest = list(chunks)
                if fds:
                    head = memoryview(rest[0]).cast("B")
                    sent = await self._sendmsg_fds(head, fds)
                    rest[0] = head[sent:]
                for chunk in rest:
                    if len(chunk):
                        await self._sendall(chunk)
            except (ConnectionError, OSError, ValueError) as e:
                if self._broken is None:
                    self._broken = f"writing to {self.label}: {e}"
                raise PeerClosed(self._broken) from None

    def send_now(self, data: bytes) -> bool:
        """Writes one whole message without descriptors now, from the caller, if nothing else
        is being written: ``True`` if it is sent (what the socket did not take at once is
        written by a task, before any later message), ``False`` if nothing was written
        (another write is in progress, the socket is full or the connection is closed):
        the caller then sends it with :meth:`send`.

        This spares a small answer the event-loop turn a task needs to start, which a
        busy node's other connections would otherwise fill (issue 11)."""
        if (
            self.closed
            or self._broken is not None
            or self._tail is not None
            or self._senders
            or self.send_lock.locked()
        ):
            return False
        try:
            sent = self.sock.send(data, _SEND_FLAGS)
        except OSError:
            return False  # full, or broken: the caller's send waits, or says why
        if sent < len(data):
            self._tail = memoryview(data)[sent:]
            self._tail_task = self.loop.create_task(self._flush_tail())
        return True

    async def _write_tail(self) -> None:
        """Writes what :meth:`send_now` left (with ``send_lock`` held)."""
        if self._tail is None:
            return
        try:
            await self._sendall(self._tail)
        finally:
            self._tail = None

    async def _flush_tail(self) -> None:
        async with self.send_lock:
            try:
                await self._write_tail()
            except (PeerClosed, ConnectionError, OSError, ValueError) as e:
                if self._broken is None:
                    self._broken = f"writing to {self.label}: {e}"

    def try_send_now(self, data: bytes) -> None:
        """Writes ``data`` if the socket takes it at once (best effort, never waits)."""
        if self.closed or self.send_lock.locked():
            return
        try:
            self.sock.send(data, _SEND_FLAGS)
        except OSError:
            pass

    # ------------------------------------------------------------------ closing

    def _wake_writer(self) -> None:
        w = self._write_waiter
        if w is not None and not w.done():
            w.set_result(None)

    def shutdown(self) -> None:
        """Ends the connection in both directions; the reader sees the end of the stream."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self._broken is None:
            self._broken = f"the connection to {self.label} is closed"
        self._wake_writer()

    async def _drain(self, seconds: float, limit: int) -> None:
        """Reads and drops input until the peer closes, ``seconds`` pass, or ``limit`` bytes came."""
        deadline = time.monotonic() + seconds
        got = 0
        while got < limit:
            try:
                data = self._recv_now(min(READ_CHUNK, limit - got))
            except (BlockingIOError, InterruptedError):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                try:
                    await self._readable(left, "drain")
                except (WireError, PeerClosed):
                    return
                continue
            except OSError:
                return
            finally:
                self.close_fds()
            if not data:
                return
            got += len(data)

    async def aclose(self, drain: Optional[float] = None) -> None:
        """Closes the socket (after a message being written has finished or failed) and
        every unclaimed descriptor. Only the connection's reader calls this.

        With ``drain`` (seconds; 0 for only what is already there), the sending side is
        shut down first and input is read and dropped for that long (at most the
        bounds' ``drain_bytes``) before the socket is closed (spec §11.3)."""
        if self.closed:
            return
        if drain is not None:
            try:
                self.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            try:
                await self._drain(drain, self.bounds.drain_bytes)
            except asyncio.CancelledError:
                pass
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
        self.close_fds()
