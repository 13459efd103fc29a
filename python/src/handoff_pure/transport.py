"""Bytes and file descriptors on a connection: a non-blocking socket driven by asyncio.

Asyncio's streams cannot pass file descriptors, so a connection is a plain
non-blocking socket: reads go through a small buffer (headers) or straight into the
destination (frames); on a Unix socket every read is a ``recvmsg`` that also collects
the descriptors that arrive (SCM_RIGHTS), in order, for the message headers to claim
(spec §7.2). Writes of one message happen under a lock so that messages never
interleave; a message's descriptors ride on the ``sendmsg`` that carries the first
byte of its length prefix.

Until its handshake completes (:attr:`Transport.handshaking`) a connection reads exactly
the bytes of the handshake message it is reading, never beyond (spec §5.1), and on a
Unix socket closes every descriptor the moment it arrives and fails the read with
``bad-shm``: a peer that has proven nothing can make the node hold none, and the
descriptors of the first message after ``ready`` (which ride on its first byte) are
never read with handshake bytes. Whether the peer's whole preamble arrived
(:attr:`Transport.preamble_received`) decides whether an ``error`` may be sent (§3, §11.3).

Time is bounded both ways (spec §9.1): inside a message (after its first byte and
before its last) a read that waits longer than ``progress_timeout`` for the next byte
fails with ``timeout``; a write that makes no progress for ``write_timeout`` closes
the connection, so only that peer's sends fail. Closing after an error (§11.3) shuts
down the sending side first and drains what still arrives for a moment, so that the
peer reads our ``error`` instead of a reset.

Between messages a read waits without a limit of its own: a TCP connection given a
timeout (:meth:`Transport.set_tcp_timeout`) has keepalive probes and ``TCP_USER_TIMEOUT``
from it (:func:`keepalive_plan`), so that the kernel ends the wait with ``ETIMEDOUT``
when the peer's host stops answering (lost power, cut off) within that timeout, as
Dask's TCP comm does for ``distributed.comm.timeouts.tcp``. What ended a connection, an
``OSError`` where there was one, is kept as :attr:`Transport.failure` for the layers
above (a Dask comm raises it as its ``CommClosedError``'s cause).

One class, :class:`Transport`, whose reads, writes and close share the socket, its
buffer, its descriptors and its timers: it stays whole although it is about 600 lines.
"""

from __future__ import annotations

import array
import asyncio
import collections
import errno
import os
import socket
import ssl
import sys
import time
from typing import Callable, Optional, Sequence

from handoff.bounds import DEFAULT_BOUNDS, Bounds
from handoff.errors import PeerClosed
from .wire import LEN_PREFIX, PREAMBLE_LEN, Limits, WireError
from .wire.framing import header_length_at

__all__ = ["Transport", "MAX_FDS_PER_READ", "keepalive_plan", "raise_unix_send_buffer"]

READ_CHUNK = 64 * 1024
#: Most descriptors accepted with one read (spec §7.2); more is ``bad-shm``.
MAX_FDS_PER_READ = 64
_ANC_SPACE = socket.CMSG_SPACE(MAX_FDS_PER_READ * array.array("i").itemsize)
# Plain ints: the socket module's flags are enum.IntFlag members, whose ``&`` runs Python
# code (a few microseconds on every read).
_RECV_FLAGS = int(getattr(socket, "MSG_CMSG_CLOEXEC", 0))
_SEND_FLAGS = int(getattr(socket, "MSG_NOSIGNAL", 0))
_MSG_CTRUNC = int(getattr(socket, "MSG_CTRUNC", 0))
#: A plain socket that cannot go on now raises one of these …
_WOULD_BLOCK = (BlockingIOError, InterruptedError)
#: … a TLS socket one of these as well (its record needs the socket readable or writable).
_TLS_WANT = (ssl.SSLWantReadError, ssl.SSLWantWriteError)
_TLS_WOULD_BLOCK = _WOULD_BLOCK + _TLS_WANT
#: Pieces one ``sendmsg`` gathers at most (Linux's ``IOV_MAX``).
_IOV_MAX = 1024


#: The send buffer asked for on a Unix socket (``SO_SNDBUF``; the kernel caps it at
#: ``net.core.wmem_max``): Linux's default (about 208 KiB) holds less than one frame of a
#: few hundred KiB, so such a frame went over in several turns of both event loops, each
#: a wakeup of the other process. ``HANDOFF_UNIX_SNDBUF`` sets it (0: the kernel's default).
def _unix_send_buffer(default: int = 4 << 20) -> int:
    raw = os.environ.get("HANDOFF_UNIX_SNDBUF", "")
    if not raw:
        return default
    try:
        return max(0, int(raw))
    except ValueError:
        print(
            f"handoff: HANDOFF_UNIX_SNDBUF={raw!r} is not a number of bytes; asking for {default}",
            file=sys.stderr,
        )
        return default


UNIX_SEND_BUFFER = _unix_send_buffer()


def raise_unix_send_buffer(sock: socket.socket) -> None:
    """Asks for :data:`UNIX_SEND_BUFFER` on a Unix socket a node made or accepted, if its
    send buffer is smaller (a :class:`Transport` leaves the buffers of the sockets it is
    given as they are)."""
    if not UNIX_SEND_BUFFER:
        return
    try:
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) < UNIX_SEND_BUFFER:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UNIX_SEND_BUFFER)
    except OSError:
        pass  # the kernel's default stays


#: Keepalive probes sent before a silent peer is given up (Linux's default, and Dask's).
KEEPALIVE_PROBES = 10


def keepalive_plan(timeout: float) -> tuple[int, int, int]:
    """``(idle, interval, probes)`` in whole seconds for a TCP connection that must notice a
    silent peer within ``timeout`` seconds: ``idle + interval * probes == timeout``, with
    ``probes`` = :data:`KEEPALIVE_PROBES`, a quarter of the timeout (at least 2 s) idle
    before the first probe and the rest spread over the probes (at least 1 s apart): the
    values Dask's TCP comm derives from ``distributed.comm.timeouts.tcp`` (the engine's is
    ``handoff_proto::bounds::keepalive_plan``). ``ValueError`` below ``probes + 1`` seconds,
    where no such plan exists."""
    whole = int(timeout)
    if whole < KEEPALIVE_PROBES + 1:
        raise ValueError(f"a TCP timeout is at least {KEEPALIVE_PROBES + 1} s (one per keepalive probe), got {timeout}")
    first = max(2, whole // 4)
    interval = max(1, (whole - first) // KEEPALIVE_PROBES)
    return whole - interval * KEEPALIVE_PROBES, interval, KEEPALIVE_PROBES


#: Linux's ``TCP_USER_TIMEOUT`` (since 2.6.37), where the socket module lacks the name.
_TCP_USER_TIMEOUT = getattr(socket, "TCP_USER_TIMEOUT", 18)


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(False)


class Transport:
    """One connection's socket (TCP or Unix stream), or the TLS socket over it (:meth:`use_tls`)."""

    #: The flags of every ``send`` (a TLS socket refuses any), and what a write that
    #: cannot go on now raises: both are class attributes that :meth:`use_tls` shadows, so
    #: a plain connection does no work for TLS (an ``except`` evaluates its classes only
    #: when something was raised).
    _send_flags = _SEND_FLAGS
    _would_block = _WOULD_BLOCK
    #: Whether the connection runs inside TLS (spec §3.1).
    tls = False
    #: Whether its TLS handshake completed (set by the node).
    tls_ready = False
    #: The TLS error a read failed with, if one did (the node explains it).
    tls_failure: Optional[ssl.SSLError] = None

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
        self._fd_error: Optional[str] = None
        #: How many times a read waited for the socket (its reader then had no backlog).
        self.read_waits = 0
        #: Whether the socket is registered with the loop for reading (:meth:`_readable`),
        #: and the future of the read that waits for it, if one does.
        self._watching = False
        self._read_waiter: Optional[asyncio.Future] = None
        #: For the read that waits: how many bytes :meth:`_on_readable` receives for it
        #: (0: it only wakes the read, which receives itself).
        self._read_want = 0
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
        #: Until the handshake completes: reads take exactly the bytes asked for, and
        #: descriptors are refused as they arrive (spec §5.1). The handshake clears it.
        self.handshaking = True
        #: Descriptors that arrived (and were closed at once) while :attr:`handshaking`.
        self.refused_fds = 0
        #: Whether the peer's whole 16-byte preamble was received: before that, nothing
        #: but our own preamble goes out, not even an ``error`` (spec §3, §11.3).
        self.preamble_received = False
        #: The event loop's time by which the handshake must be done (set by the node); what
        #: is read after it is not acted on (§5.7: the dialer-nonce window relies on it).
        self.handshake_deadline: Optional[float] = None
        #: The node id this connection's handshake claimed in step 6, until it is registered.
        self.claimed: Optional[str] = None
        #: On a Unix socket: the peer's process id (``SO_PEERCRED``), set by the node.
        self.peer_pid: Optional[int] = None
        #: Set by the reader of an established connection: ``on_messages(data)`` handles
        #: whole messages at the start of ``data`` and returns how many bytes it handled.
        #: :meth:`_on_readable` offers it what it receives for a read that waits between
        #: messages (:attr:`_idle_wait`), so that such a message is handled in the loop's
        #: readable callback and the reader is not woken for it (a turn of the loop less).
        self.on_messages: Optional[Callable[[bytes], int]] = None
        #: Whether the waiting read waits for the first byte of a message, nothing buffered.
        self._idle_wait = False
        #: What ended the connection first, if it failed rather than closed: the
        #: ``OSError`` of a read or a write (a reset, ``ETIMEDOUT`` from keepalive or the
        #: user timeout, a broken pipe), or a ``TimeoutError`` with ``ETIMEDOUT`` for this
        #: transport's own progress and write timeouts. ``None`` for a clean end.
        self.failure: Optional[OSError] = None
        self.closed = False
        if not self.unix:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def _failed(self, error: OSError) -> None:
        """Keeps the first error that ended the connection (:attr:`failure`)."""
        if self.failure is None and not self.closed:
            self.failure = error

    def set_tcp_timeout(self, timeout: Optional[float]) -> None:
        """Keepalive probes and ``TCP_USER_TIMEOUT`` so that a silent peer (its host lost
        power or was cut off) fails reads and writes with ``ETIMEDOUT`` within ``timeout``
        seconds (:func:`keepalive_plan`); nothing on a Unix socket or for ``None``. A
        platform without one of the options keeps what it has (as Dask's TCP comm)."""
        if self.unix or timeout is None:
            return
        idle, interval, probes = keepalive_plan(timeout)
        sock = self.sock
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if hasattr(socket, "TCP_KEEPIDLE"):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, probes)
            if sys.platform.startswith("linux"):
                sock.setsockopt(socket.IPPROTO_TCP, _TCP_USER_TIMEOUT, int(timeout) * 1000)
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
        return out

    def close_fds(self) -> None:
        while self.fds:
            fd = self.fds.popleft()
            try:
                os.close(fd)
            except OSError:
                pass

    def _collect(self, ancdata, flags) -> None:
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                if self.handshaking:
                    # Before the connection is established no message carries any (§5.1):
                    # hold none of them, not even until the read returns.
                    for fd in fds:
                        try:
                            os.close(fd)
                        except OSError:
                            pass
                    self.refused_fds += len(fds)
                    continue
                for fd in fds:
                    if _RECV_FLAGS == 0:
                        os.set_inheritable(fd, False)
                    self.fds.append(fd)
        if self.handshaking:
            if flags & _MSG_CTRUNC:
                self.refused_fds = max(self.refused_fds, 1)
            return
        if flags & _MSG_CTRUNC:
            self._fd_error = (
                f"descriptors passed with one read were cut off: more than {MAX_FDS_PER_READ} came, "
                "or this process has no descriptor left to take them (its RLIMIT_NOFILE)"
            )
        elif len(self.fds) > self.bounds.max_pending_fds:
            self._fd_error = f"over {self.bounds.max_pending_fds} descriptors arrived that no header claimed"
            # Keep none of them: the connection is about to fail, and they must not pile up.
            self.close_fds()

    def _on_readable(self) -> None:
        w = self._read_waiter
        if w is None:
            # Nobody reads now (the reader waits for room, or handles a message): stop
            # watching, or the loop would call this at every turn until it reads.
            self._unwatch()
            return
        if w.done():  # timed out or cancelled: its reader, resuming, receives nothing
            self._read_waiter = None
            return
        if self._read_want:
            # Receive now, for the waiting read: the bytes are then off the socket before
            # the loop polls again. (Woken only, the read would receive in the next turn,
            # after a poll that reports the same bytes again and wakes its next wait for
            # nothing: an extra turn and a failed receive per message.)
            try:
                data = self._recv_now(self._read_want)
            except (BlockingIOError, InterruptedError):
                return  # nothing after all: keep waiting
            except (ConnectionError, OSError) as e:
                self._read_waiter = None
                w.set_exception(e)  # the read records it (it may have been closed meanwhile)
                return
            if self._idle_wait and data and self.on_messages is not None and not self.fds and self._fd_error is None:
                try:
                    used = self.on_messages(data)
                except BaseException as e:
                    # Raised by the application (a node's on_accept): the waiting read
                    # raises it, and its reader closes the connection, as if it had
                    # handled the message itself. The rest of what arrived is not read.
                    self._read_waiter = None
                    if not w.done():
                        w.set_exception(e)
                    return
                if used == len(data):
                    return  # all handled here: the read goes on waiting for the next message
                if used:
                    data = data[used:]
                if w.done():  # the handling cancelled the read
                    self._read_waiter = None
                    return
            self._read_waiter = None
            w.set_result(data)
            return
        self._read_waiter = None
        w.set_result(None)

    def _unwatch(self) -> None:
        if self._watching:
            self._watching = False
            try:
                self.loop.remove_reader(self.sock.fileno())
            except (ValueError, OSError):
                pass

    async def _readable(self, timeout: Optional[float], what: str, want: int = 0) -> Optional[bytes]:
        """Waits until the socket is readable (at most ``timeout`` seconds, then ``timeout``).

        With ``want``, returns what a receive of at most ``want`` bytes took then (``b""``
        at the end of the stream); without, ``None``.

        The socket stays registered with the loop after the wait: a connection whose
        reader waits for every message would otherwise add and remove it (two system
        calls) each time. :meth:`_on_readable` removes it when it fires with no read
        waiting."""
        if self.closed:
            raise PeerClosed(f"the connection to {self.label} is closed")
        self.read_waits += 1
        fut = self.loop.create_future()
        if not self._watching:
            self.loop.add_reader(self.sock.fileno(), self._on_readable)
            self._watching = True
        self._read_waiter = fut
        self._read_want = want
        timer = self.loop.call_later(timeout, _expire, fut) if timeout is not None else None
        try:
            ok = await fut
        finally:
            if timer is not None:
                timer.cancel()
            if self._read_waiter is fut:
                self._read_waiter = None
        if ok is False:
            message = f"timed out: no byte from {self.label} for {timeout:g} s in the middle of a message ({what})"
            self._failed(TimeoutError(errno.ETIMEDOUT, message))
            raise WireError("timeout", message)
        return ok

    def _anc_space(self) -> int:
        """Room for descriptors in one read: none while :attr:`handshaking`, so that any a
        peer sends then are closed by the kernel before they reach this process (the read
        only learns that they came, from ``MSG_CTRUNC``)."""
        return 0 if self.handshaking else _ANC_SPACE

    def _recv_now(self, nbytes: int) -> bytes:
        if self.unix:
            data, anc, flags, _ = self.sock.recvmsg(nbytes, self._anc_space(), _RECV_FLAGS)
            self._received += len(data)
            self._collect(anc, flags)
        else:
            data = self.sock.recv(nbytes)
            self._received += len(data)
        return data

    def use_tls(self, sock: ssl.SSLSocket) -> None:
        """From now on reads and writes go through ``sock``, the TLS socket over this
        connection's TCP socket (wrapped before its handshake, so that closing the
        transport closes it whatever happens next). Only before the first byte is read."""
        self.sock = sock
        self.tls = True
        self._send_flags = 0
        self._would_block = _TLS_WOULD_BLOCK
        self._recv_now = self._tls_recv_now
        self._recv_into_now = self._tls_recv_into_now

    # On a TLS socket a receive may return one record's bytes while more are decrypted and
    # waiting inside it, where the loop's poll of the descriptor cannot see them: every
    # wait in this class comes after a receive that found nothing (``_recv``,
    # ``_recv_into``, ``_drain``), so none is left unread. A record that needs more bytes
    # raises ``SSLWantReadError``, which reads as a plain socket's ``BlockingIOError``.

    def _tls_recv_now(self, nbytes: int) -> bytes:
        try:
            data = self.sock.recv(nbytes)
        except _TLS_WANT:
            raise BlockingIOError from None
        except ssl.SSLError as e:
            self.tls_failure = e
            raise
        self._received += len(data)
        return data

    def _tls_recv_into_now(self, view: memoryview) -> int:
        try:
            n = self.sock.recv_into(view)
        except _TLS_WANT:
            raise BlockingIOError from None
        except ssl.SSLError as e:
            self.tls_failure = e
            raise
        self._received += n
        return n

    def _recv_into_now(self, view: memoryview) -> int:
        if self.unix:
            n, anc, flags, _ = self.sock.recvmsg_into([view], self._anc_space(), _RECV_FLAGS)
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
                    pass
                data = await self._readable(timeout, what, nbytes)
                if data is not None:
                    return data
        except (ConnectionError, OSError) as e:
            if self.closed:
                return b""
            self._failed(e)
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
            self._failed(e)
            raise PeerClosed(f"reading from {self.label}: {e}") from None

    def _check_handshake_fds(self) -> None:
        """Fails the read at once if descriptors arrived before the connection was established (§5.1)."""
        if self.refused_fds:
            raise WireError(
                "bad-shm",
                f"bad shared-memory descriptor: file descriptors arrived from {self.label} "
                "before the connection was established (closed unopened)",
            )

    async def _fill(self, n: int, what: str, at_boundary: bool) -> bool:
        """Buffers at least ``n`` bytes; ``False`` at a clean end of stream before any byte.

        Waiting for the first byte of a message (``at_boundary``, nothing buffered) has no
        time limit; every later wait is bounded by the progress timeout. While the
        connection :attr:`handshaking`, it receives exactly the bytes missing, never more,
        and fails with ``bad-shm`` as soon as a read brought descriptors."""
        while len(self._buf) - self._pos < n:
            if self._pos:
                del self._buf[: self._pos]
                self._pos = 0
            idle = at_boundary and not self._buf
            timeout = None if idle else self.bounds.progress_timeout
            if self.handshaking:
                data = await self._recv(n - len(self._buf), timeout, what)
                self._check_handshake_fds()
            else:
                self._idle_wait = idle
                try:
                    data = await self._recv(max(READ_CHUNK, n - len(self._buf)), timeout, what)
                finally:
                    self._idle_wait = False
            if not data:
                if at_boundary and not self._buf:
                    return False
                raise WireError("truncated", f"truncated input: {what} needs {n} bytes, only {len(self._buf)} present")
            self._buf += data
        return True

    def _take(self, n: int) -> bytes:
        pos, end = self._pos, self._pos + n
        if pos == 0 and end == len(self._buf):  # all that is buffered: one copy, no slice
            out = bytes(self._buf)
        else:
            with memoryview(self._buf) as view:
                out = bytes(view[pos:end])
        if end == len(self._buf):
            self._buf.clear()
            self._pos = 0
        else:
            self._pos = end
        return out

    async def read_preamble(self) -> bytes:
        """The peer's 16 preamble bytes (then :attr:`preamble_received` is set)."""
        await self._fill(PREAMBLE_LEN, "preamble", False)
        self.preamble_received = True
        return self._take(PREAMBLE_LEN)

    def established(self) -> None:
        """The handshake completed: reads go back to buffering ahead, and descriptors are
        kept for the headers that claim them (§7.2)."""
        self.handshaking = False

    async def read_length(self, limits: Limits) -> Optional[int]:
        """The next header's length (its prefix checked, §11.2 step 1), or ``None`` at a
        clean end of stream. The header itself is read by :meth:`read_header_body`."""
        if not await self._fill(LEN_PREFIX, "header length", True):
            return None
        n = header_length_at(self._buf, self._pos, limits)
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
            with memoryview(self._buf) as buffered:  # a slice of the bytearray itself would be a copy
                dest[:have] = buffered[self._pos : self._pos + have]
            self._pos += have
            if self._pos == len(self._buf):
                self._buf.clear()
                self._pos = 0
        pos = have
        if self.tls and pos < n:
            pos = await self._tls_read_into(dest, pos, what, progress)
        while pos < n:
            got = await self._recv_into(dest[pos:], self.bounds.progress_timeout, what)
            if not got:
                raise WireError("truncated", f"truncated input: {what} needs {n} bytes, only {pos} present")
            pos += got
            if progress is not None:
                progress(pos)

    async def _tls_read_into(self, dest: memoryview, pos: int, what: str, progress) -> int:
        """:meth:`read_into` on a TLS socket: fills ``dest`` from ``pos`` on, record after
        record (a TLS receive returns at most one record, 16 KiB), in one loop that waits
        only when no record is ready, instead of a coroutine per record. Returns ``len(dest)``;
        raises as :meth:`_recv_into` does."""
        n = len(dest)
        read = self.sock.read
        timeout = self.bounds.progress_timeout
        try:
            while pos < n:
                try:
                    got = read(n - pos, dest[pos:])
                except _TLS_WANT:
                    await self._readable(timeout, what)
                    continue
                except ssl.SSLError as e:
                    self.tls_failure = e
                    raise
                if not got:
                    raise WireError("truncated", f"truncated input: {what} needs {n} bytes, only {pos} present")
                pos += got
                self._received += got
                if progress is not None:
                    progress(pos)
        except (ConnectionError, OSError) as e:
            if self.closed:
                raise WireError("truncated", f"truncated input: {what} needs {n} bytes, only {pos} present") from None
            self._failed(e)
            raise PeerClosed(f"reading from {self.label}: {e}") from None
        return pos

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
            self._failed(TimeoutError(errno.ETIMEDOUT, self._broken))
            self.shutdown()
            raise PeerClosed(self._broken)

    async def _sendall(self, data) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            try:
                sent = self.sock.send(view, self._send_flags)
            except self._would_block as e:
                if type(e) is ssl.SSLWantReadError:
                    # TLS wants to read before it writes (its peer renegotiates): the reader
                    # reads; waiting for the socket to be writable would spin.
                    await asyncio.sleep(0.001)
                    continue
                await self._writable()
                continue
            view = view[sent:]

    async def _sendmsg_all(self, chunks: Sequence, fds: Sequence[int]) -> None:
        """Writes ``chunks`` with gathering ``sendmsg`` calls (at most :data:`_IOV_MAX`
        pieces each): a message of a header and its frames goes out in one system call
        where the socket takes it, so the receiver wakes once for it, not once per piece.
        ``fds`` ride on the call that sends the first byte (spec §7.2). Not for TLS,
        whose socket has no ``sendmsg``."""
        views = [v for v in (memoryview(c).cast("B") for c in chunks) if len(v)]
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
        first = 0
        while first < len(views):
            try:
                sent = self.sock.sendmsg(views[first : first + _IOV_MAX], ancillary, self._send_flags)
            except self._would_block:
                await self._writable()
                continue
            ancillary = []  # they went with the first byte
            while sent:
                n = len(views[first])
                if sent < n:
                    views[first] = views[first][sent:]
                    break
                sent -= n
                first += 1

    async def send(self, chunks: Sequence, fds: Sequence[int] = ()) -> None:
        """Writes ``chunks`` (bytes-like, flat byte views) as one message; ``fds`` ride on its first byte.

        Raises :class:`PeerClosed` if the connection is closed, or if the peer reads
        nothing for the write timeout (the connection is then closed)."""
        if len(chunks) == 1 and not fds and type(chunks[0]) is bytes and self._may_write_now():
            # One piece and nothing else being written: write it now, without the lock's
            # machinery; what the socket does not take is written below, under the lock,
            # before this returns (nothing can come between: there is no await before it).
            data = chunks[0]
            try:
                sent = self.sock.send(data, self._send_flags)
            except OSError:
                sent = 0  # full, or broken: the path below waits, or says why
            if sent == len(data):
                return
            chunks = (memoryview(data).cast("B")[sent:],)
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
                if not self.tls:
                    await self._sendmsg_all(chunks, fds)
                else:
                    for chunk in chunks:
                        if len(chunk):
                            await self._sendall(chunk)
            except (ConnectionError, OSError, ValueError) as e:
                if self._broken is None:
                    self._broken = f"writing to {self.label}: {e}"
                if isinstance(e, OSError):
                    self._failed(e)
                raise PeerClosed(self._broken) from None

    def _may_write_now(self) -> bool:
        """Whether a whole message may be written now: nothing else is being written or
        waits to be (a sender in :meth:`send`, a tail of :meth:`send_now`), and the
        connection is open."""
        return not (
            self.closed
            or self._broken is not None
            or self._tail is not None
            or self._senders
            or self.send_lock.locked()
        )

    def send_now(self, data: bytes) -> bool:
        """Writes one whole message without descriptors now, from the caller, if nothing else
        is being written: ``True`` if it is sent (what the socket did not take at once is
        written by a task, before any later message), ``False`` if nothing was written
        (another write is in progress, the socket is full or the connection is closed):
        the caller then sends it with :meth:`send`.

        This spares a small answer the event-loop turn a task needs to start, which a
        busy node's other connections would otherwise fill (issue 11)."""
        if not self._may_write_now():
            return False
        try:
            sent = self.sock.send(data, self._send_flags)
        except OSError as e:
            if not (self.tls and isinstance(e, _TLS_WANT)):
                return False  # full, or broken: the caller's send waits, or says why
            # TLS may have taken a part of it into a record it must finish with the same
            # bytes: they go out from the tail, like any rest.
            sent = 0
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
                if isinstance(e, OSError):
                    self._failed(e)

    def try_send_now(self, data: bytes) -> None:
        """Writes ``data`` if the socket takes it at once (best effort, never waits)."""
        if self.closed or self.send_lock.locked():
            return
        if self.tls:
            # A TLS write that stops half way must be finished with the same bytes; and
            # before its handshake completed there is nothing to say in plain text.
            if self.tls_ready:
                self.send_now(data)
            return
        try:
            self.sock.send(data, self._send_flags)
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
        if not self.send_lock.locked():
            # Free: taken without a turn of the loop, so that whoever waits for this
            # connection's end (a comm's read) hears of it as soon as with a plain socket.
            await self.send_lock.acquire()
            locked = True
        else:
            try:
                await asyncio.wait_for(self.send_lock.acquire(), 5)
                locked = True
            except (asyncio.TimeoutError, asyncio.CancelledError):
                locked = False
        self.closed = True
        self._watching = False
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
