"""What the pure-Python reference checks before it writes a message (spec §9): the header
length, the frame count, each frame's size and their sum, against the limits it sends
within (:func:`send_limits`); a message over one fails that one send with
:class:`~handoff.errors.MessageTooLarge`, naming the limit, instead of going out and
closing the connection on the receiver. Texts it writes into its own answers from what a
peer sent (an ``error``'s or a ``ticket-error``'s ``msg``) are clipped (:func:`clip`), so
that an answer stays far below any limit whatever the peer sent.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

from handoff import wire
from handoff.errors import MessageTooLarge

__all__ = ["send_limits", "check_header", "check_frames", "clip", "MAX_TEXT"]

#: The most characters of an ``error`` or ``ticket-error`` text this node sends.
MAX_TEXT = 1024


def send_limits(limits: wire.Limits) -> wire.Limits:
    """The limits a node sends within: the defaults of §9, or ``limits`` where smaller (the
    engine's: ``handoff_wire::Limits::for_sending``)."""
    d = wire.DEFAULT_LIMITS
    return dataclasses.replace(
        limits,
        max_header_bytes=min(d.max_header_bytes, limits.max_header_bytes),
        max_frames=min(d.max_frames, limits.max_frames),
        max_frame_bytes=min(d.max_frame_bytes, limits.max_frame_bytes),
        max_message_bytes=min(d.max_message_bytes, limits.max_message_bytes),
    )


def check_header(n: int, limits: wire.Limits, to: str) -> None:
    """A header of ``n`` bytes (without its prefix) must fit ``limits``; else ``MessageTooLarge``."""
    if n > limits.max_header_bytes:
        raise MessageTooLarge(
            f"not sent to {to}: its header would be {n} bytes, over the header limit of {limits.max_header_bytes} "
            "bytes a receiver enforces (spec §9); put large values in buffers, which travel as frames",
            "header-too-large",
            limits.max_header_bytes,
        )


def check_frames(sizes: Iterable[int], limits: wire.Limits, to: str) -> None:
    """Frames of these sizes (in order) must fit ``limits``: their count, each size, their
    sum; else ``MessageTooLarge`` naming the first limit broken."""
    sizes = list(sizes)
    if len(sizes) > limits.max_frames:
        raise MessageTooLarge(
            f"not sent to {to}: the message would have {len(sizes)} frames, over the limit of {limits.max_frames} "
            "frames per message a receiver enforces (spec §9)",
            "too-many-frames",
            limits.max_frames,
        )
    total = 0
    for i, n in enumerate(sizes):
        if n > limits.max_frame_bytes:
            raise MessageTooLarge(
                f"not sent to {to}: frame {i} would be {n} bytes, over the limit of {limits.max_frame_bytes} bytes "
                "per frame a receiver enforces (spec §9)",
                "frame-too-large",
                limits.max_frame_bytes,
            )
        total += n
        if total > limits.max_message_bytes:
            raise MessageTooLarge(
                f"not sent to {to}: its frames would add up to more than {limits.max_message_bytes} bytes, the "
                "limit per message a receiver enforces (spec §9)",
                "message-too-large",
                limits.max_message_bytes,
            )


def clip(text: str, most: int = MAX_TEXT) -> str:
    """``text``, cut to ``most`` characters (with a mark) if it is longer."""
    if len(text) <= most:
        return text
    keep = most - 24
    return text[:keep] + f" … ({len(text) - keep} more)"
