"""Dask's frames as handoff messages, and back (no I/O here).

A Dask message is the list of frames that ``distributed.comm.utils.to_frames`` makes:
a msgpack header, sub-headers, and the buffers of serialized objects, large ones cut in
shards of ``distributed.comm.shard`` (64 MiB) that are consecutive slices of one buffer.
It travels as one or more ``handoff.dask.Frames`` messages (*parts*) whose body is::

    {"f": [entry, ...], "more": true}      # every part but the last has "more"

and each entry is one of

- ``bin``: a frame smaller than 1 KiB, in the body itself;
- a frame reference (§8.2): one frame, out of band (inline bytes on TCP; on a Unix
  socket a shared-memory segment from ``shm-threshold`` up, 1 MiB by default);
- ``{"cut": [n1, n2, ...], "f": ref}``: one out-of-band frame that holds two or more
  consecutive Dask frames of these lengths, each at least :data:`SMALL` — the shards of
  one buffer, sent as one piece so that
  the receiver gets them as slices of one buffer (one mapping, or one read), which
  Dask then joins without a copy (``merge_memoryviews`` only joins slices of one
  buffer);
- ``{"cuda": ref}``: one Dask frame of GPU memory (a CuPy array the route-aware
  serializer left as it is for a same-host peer that maps GPU memory, spec §7.10): the
  node sends it by its CUDA IPC handle, and the receiver gets the mapped memory;
- ``{"join": [ref, ...]}``: one Dask frame larger than a handoff frame may be (4 GiB),
  in pieces. The receiver must join them by a copy: they arrive in separate buffers (one
  read or one mapping each), and Dask keeps a frame as one buffer. A copy of that size
  (over 4 GiB) must not stall the event loop, so :func:`unpack_part` can leave a
  :class:`Join` in its place for the caller to run in a thread (the comm runs it in
  Dask's offload thread), and :meth:`Join.run` copies in slices of
  :data:`JOIN_SLICE`, so that even in a thread the copy gives the interpreter lock up
  between slices. (The alternative, pieces passed to Dask as consecutive frames, is
  not open: Dask's deserializers take one frame per buffer, and its
  ``merge_memoryviews`` joins without a copy only slices of one buffer.)

A message is cut into parts so that each stays within the receiver's limits (§9:
1024 frames, 16 GiB; §7.2: 64 shared segments) and its body within the header limit.

What a receiver takes is bounded before it is made: a message holds at most
:data:`MAX_DASK_FRAMES` Dask frames (a peer could otherwise make a receiver hold a list
entry and a view, about :data:`FRAME_COST` bytes, for every 1 or 2 bytes it sends: empty
bins, or a ``cut`` of zero lengths, which no sender makes), and the comm charges each
frame :data:`FRAME_COST` bytes beside its own against the message's size bound.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from .. import native
from ..buffers import as_bytes_view
from ..codec import Bin, Buffer
from ..cuda import array_nbytes, is_cuda_array
from ..wire import DEFAULT_LIMITS, Limits

__all__ = [
    "TYPE_OPEN",
    "TYPE_FRAMES",
    "Plan",
    "plan_message",
    "unpack_part",
    "host_nbytes",
    "host_bytes",
    "FramesError",
    "SMALL",
    "Join",
    "MAX_DASK_FRAMES",
    "FRAME_COST",
]

#: The first message of every comm's connection, from the connecting side: its addresses.
TYPE_OPEN = "handoff.dask.Open"
#: A part of a Dask message.
TYPE_FRAMES = "handoff.dask.Frames"
#: Frames below this size travel inside the body.
SMALL = 1024
#: At most this many shared segments per part: the descriptors a receiver takes with one
#: read (§7.2, ``handoff_proto::inbound::MAX_FDS_PER_READ``).
_MAX_SHM_PER_PART = native.required("handoff.dask").MAX_FDS_PER_READ
#: At most this many body bytes per part (the header, which holds the body, is at most 16 MiB).
_MAX_BODY_PER_PART = 8 << 20
#: A :class:`Join` copies this many bytes at a time (a few milliseconds each).
JOIN_SLICE = 16 << 20
#: At most this many Dask frames in one message (Dask's own messages hold a few per
#: object they carry).
MAX_DASK_FRAMES = 1 << 20
#: What a received Dask frame costs its receiver besides its bytes (a list entry and the
#: object, ``bytes`` or ``memoryview``), charged against the message's size bound.
FRAME_COST = 64


class FramesError(ValueError):
    """A received part that is not what this module sends (the comm is then aborted)."""


@dataclass
class Plan:
    """The parts of one Dask message (bodies for ``handoff.dask.Frames``) and its size in
    bytes; ``inline``: whether every frame is in the body (no out-of-band frame)."""

    parts: list
    nbytes: int
    inline: bool = False


def _flat(frame: Any) -> memoryview:
    """A frame as a flat byte view (empty frames of any shape included)."""
    view = frame if isinstance(frame, memoryview) else memoryview(frame)
    return as_bytes_view(view) if view.nbytes else memoryview(b"")


def _address(view: memoryview) -> Optional[int]:
    np = sys.modules.get("numpy")
    if np is None:
        return None
    try:
        return np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0]
    except (TypeError, ValueError):
        return None


def _runs(views: list) -> list:
    """Groups the indexes of consecutive views that are adjacent slices of one buffer."""
    runs: list = []
    prev_end = None
    for i, v in enumerate(views):
        addr = _address(v) if v.nbytes >= SMALL and v.obj is not None else None
        if runs and addr is not None and prev_end == addr and views[runs[-1][0]].obj is v.obj:
            runs[-1].append(i)
        else:
            runs.append([i])
        prev_end = addr + v.nbytes if addr is not None else None
    return runs


def _joined(views: list) -> Optional[memoryview]:
    """One view over adjacent slices of one buffer (``None`` if the buffer does not allow it)."""
    first = views[0]
    try:
        base = memoryview(first.obj).cast("B")
    except (TypeError, ValueError):
        return None
    start, base_addr = _address(first), _address(base)
    if start is None or base_addr is None:
        return None
    off = start - base_addr
    total = sum(v.nbytes for v in views)
    if off < 0 or off + total > base.nbytes:
        return None
    return base[off : off + total]


def _entries(frames: Sequence[Any], max_frame: int) -> list:
    """Body entries, each with the sizes of the out-of-band frames it takes: ``(entry, [n...])``."""
    out: list = []
    start = 0
    for i, f in enumerate(list(frames) + [None]):
        if f is None or is_cuda_array(f):
            out.extend(_host_entries(frames[start:i], max_frame))
            if f is not None:
                # GPU memory: one frame, whole, that the node sends by IPC handle (§7.10).
                out.append(({"cuda": Buffer(f)}, [array_nbytes(f.__cuda_array_interface__)]))
            start = i + 1
    return out


def _host_entries(frames: Sequence[Any], max_frame: int) -> list:
    views = [_flat(f) for f in frames]
    out: list = []
    for run in _runs(views):
        members = [views[i] for i in run]
        joined = _joined(members) if len(members) > 1 else None
        if joined is not None:
            # Consecutive shards: as few out-of-band frames as the frame limit allows.
            chunk: list = []
            size = 0
            for v in members + [None]:
                if v is None or (chunk and size + v.nbytes > max_frame):
                    if len(chunk) == 1:
                        out.extend(_single(chunk[0], max_frame))
                    elif chunk:
                        piece = _joined(chunk)
                        out.append(({"cut": [c.nbytes for c in chunk], "f": Buffer(piece)}, [size]))
                    chunk, size = [], 0
                if v is not None:
                    chunk.append(v)
                    size += v.nbytes
            continue
        for v in members:
            out.extend(_single(v, max_frame))
    return out


def _single(view: memoryview, max_frame: int) -> list:
    n = view.nbytes
    if n < SMALL:
        return [(Bin(bytes(view)), [])]
    if n <= max_frame:
        return [(Buffer(view), [n])]
    pieces = [view[i : i + max_frame] for i in range(0, n, max_frame)]
    return [({"join": [Buffer(p) for p in pieces]}, [p.nbytes for p in pieces])]


def plan_message(
    frames: Sequence[Any], *, shm_threshold: Optional[int] = None, limits: Limits = DEFAULT_LIMITS
) -> Plan:
    """Cuts a Dask message into parts that fit the receiver's limits.

    ``shm_threshold`` is set when the connection carries shared memory: frames from that
    size count against the 64 segments a part may carry."""
    if len(frames) > MAX_DASK_FRAMES:
        raise FramesError(
            f"a Dask message of {len(frames)} frames: a receiver takes at most {MAX_DASK_FRAMES} in one message"
        )
    plan = _one_part(frames, shm_threshold, limits)
    if plan is not None:
        return plan
    max_frame = limits.max_frame_bytes
    max_frames = limits.max_frames
    max_bytes = limits.max_message_bytes
    parts: list = []
    entries: list = []
    n_frames = n_shm = n_bytes = n_body = 0
    total = 0
    out_of_band = False
    for entry, sizes in _entries(frames, max_frame):
        out_of_band = out_of_band or bool(sizes)
        shm = sum(1 for s in sizes if shm_threshold is not None and s >= shm_threshold)
        body = 0 if sizes else len(entry) + 8
        size = sum(sizes)
        total += size + (0 if sizes else len(entry))
        if entries and (
            n_frames + len(sizes) > max_frames
            or n_shm + shm > _MAX_SHM_PER_PART
            or n_bytes + size > max_bytes
            or n_body + body > _MAX_BODY_PER_PART
        ):
            parts.append({"f": entries, "more": True})
            entries = []
            n_frames = n_shm = n_bytes = n_body = 0
        entries.append(entry)
        n_frames += len(sizes)
        n_shm += shm
        n_bytes += size
        n_body += body + 2
    parts.append({"f": entries})
    return Plan(parts, total, not out_of_band)


def _one_part(frames: Sequence[Any], shm_threshold: Optional[int], limits: Limits) -> Optional[Plan]:
    """:func:`plan_message`'s plan in one pass, for most messages: host frames (bytes, or
    C-contiguous memoryviews) that fit one part, with no two large frames in a row (which
    may be shards of one buffer, joined by the general walk). ``None``: walk."""
    entries: list = []
    total = body = n_large = n_shm = large_bytes = 0
    after_large = False
    for f in frames:
        if type(f) is bytes:
            n = len(f)
        elif type(f) is memoryview and f.c_contiguous:
            n = f.nbytes
            if n and (f.format != "B" or f.ndim != 1):
                f = f.cast("B")
        else:
            return None  # (bytearray, GPU memory, other buffers: as the walk makes them)
        total += n
        if n < SMALL:
            entries.append(Bin(f if type(f) is bytes else f.tobytes()))
            body += n + 10
            after_large = False
            continue
        if after_large or n > limits.max_frame_bytes:
            return None
        entries.append(Buffer(f if type(f) is memoryview else memoryview(f)))
        body += 2
        n_large += 1
        large_bytes += n
        n_shm += shm_threshold is not None and n >= shm_threshold
        after_large = True
    if (
        n_large > limits.max_frames
        or n_shm > _MAX_SHM_PER_PART
        or large_bytes > limits.max_message_bytes
        or body > _MAX_BODY_PER_PART
    ):
        return None
    return Plan([{"f": entries}], total, n_large == 0)


def host_bytes(frames: list, start: int = 0) -> int:
    """The host memory ``frames[start:]`` take (a :class:`Join` not yet run counts none)."""
    total = 0
    for f in frames[start:]:
        t = type(f)
        if t is memoryview:
            total += f.nbytes
        elif t is bytes:
            total += len(f)
        elif t is not Join:
            total += host_nbytes(f)
    return total


def host_nbytes(frame: Any) -> int:
    """The host memory a received frame takes (GPU memory takes none)."""
    return 0 if is_cuda_array(frame) else memoryview(frame).nbytes


def _own_buffer(frame: Any) -> Any:
    """A whole writable frame the engine received, as the array Dask's TCP comm would have
    read it into: a ``uint8`` array with no base over the frame's memory (no copy), so that
    Dask's deserializers keep it as it is and its tools that look for an array's buffer
    find it. A frame the body names again, read-only (Dask copies it: two writable arrays
    over one frame would see each other's writes); without NumPy 1.22 or later, the frame
    as it is. Anything else as it is."""
    if type(frame) is memoryview and not frame.readonly:
        owner = frame.obj
        host_array = getattr(owner, "host_array", None)
        if host_array is not None and frame.nbytes == len(owner):
            try:
                return host_array()
            except BufferError:  # named before in this message
                return frame.toreadonly()
            except RuntimeError:  # no NumPy (1.22 or later) in this process
                return frame
    return frame


def _bytes_like(value: Any) -> bool:
    return isinstance(value, (bytes, bytearray, memoryview))


class Join:
    """The pieces of one Dask frame sent as ``{"join": ...}``, to be joined by :meth:`run`."""

    __slots__ = ("pieces", "nbytes")

    def __init__(self, pieces: list):
        self.pieces = [memoryview(p).cast("B") for p in pieces]
        self.nbytes = sum(p.nbytes for p in self.pieces)

    def run(self) -> memoryview:
        """One writable buffer with the pieces' bytes, copied :data:`JOIN_SLICE` at a time
        (from any thread); the pieces are let go."""
        joined = bytearray(self.nbytes)
        out = memoryview(joined)
        pos = 0
        for piece in self.pieces:
            for start in range(0, piece.nbytes, JOIN_SLICE):
                chunk = piece[start : start + JOIN_SLICE]
                out[pos : pos + chunk.nbytes] = chunk
                pos += chunk.nbytes
        self.pieces = []
        return out


def _too_many(out: list) -> FramesError:
    return FramesError(f"the message has more than {MAX_DASK_FRAMES} Dask frames")


def unpack_part(body: Any, out: list, joins: Optional[list] = None) -> bool:
    """Appends the Dask frames of one received part to ``out``; returns whether more parts follow.

    A frame sent in pieces is joined here, unless ``joins`` is given: then a
    :class:`Join` takes its place in ``out`` and its index goes to ``joins``, for the
    caller to replace by ``Join.run()`` (off the event loop).

    Raises :class:`FramesError` for a body this module would not send, and for a message
    (``out`` and this part) of more than :data:`MAX_DASK_FRAMES` frames, before any of
    them is made."""
    if not isinstance(body, dict) or not isinstance(body.get("f"), list):
        raise FramesError(f"a {TYPE_FRAMES} body is a map with a list 'f', got {type(body).__name__}")
    more = body.get("more", False)
    if not isinstance(more, bool):
        raise FramesError("'more' is a bool")
    if len(out) + len(body["f"]) > MAX_DASK_FRAMES:
        raise _too_many(out)
    for entry in body["f"]:
        if _bytes_like(entry):
            out.append(_own_buffer(entry))
        elif isinstance(entry, dict) and "cut" in entry:
            view, sizes = entry.get("f"), entry["cut"]
            if (
                not _bytes_like(view)
                or not isinstance(sizes, list)
                or len(sizes) < 2
                or not all(isinstance(n, int) and n >= SMALL for n in sizes)
            ):
                raise FramesError(
                    f"a 'cut' entry has a frame 'f' and a list 'cut' of two or more lengths of at least {SMALL} bytes"
                )
            if len(out) + len(sizes) > MAX_DASK_FRAMES:
                raise _too_many(out)
            # Read-only: a deserializer that keeps a piece (a Dask frame of its own) copies it
            # into a buffer of its own, so that the pieces do not hold each other's memory
            # (Dask's P2P rechunk lets go of the shards of one message one by one). The shards
            # of one split Dask frame Dask joins itself (``merge_memoryviews`` takes a new view
            # of the pieces' owner, the received frame), writable and without a copy.
            view = memoryview(view).toreadonly()
            if sum(sizes) != view.nbytes:
                raise FramesError(f"'cut' lengths add up to {sum(sizes)}, the frame has {view.nbytes} bytes")
            pos = 0
            for n in sizes:
                out.append(view[pos : pos + n])
                pos += n
        elif isinstance(entry, dict) and "cuda" in entry:
            frame = entry["cuda"]
            if not is_cuda_array(frame):
                raise FramesError(f"a 'cuda' entry holds GPU memory, got {type(frame).__name__}")
            out.append(frame)
        elif isinstance(entry, dict) and "join" in entry:
            pieces = entry["join"]
            if not isinstance(pieces, list) or not all(_bytes_like(p) for p in pieces):
                raise FramesError("a 'join' entry is a list of frames")
            join = Join(pieces)
            if joins is None:
                out.append(join.run())
            else:
                joins.append(len(out))
                out.append(join)
        else:
            raise FramesError(f"unexpected entry of type {type(entry).__name__} in a {TYPE_FRAMES} body")
    return more
