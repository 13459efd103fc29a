"""What a node may send (spec §9): never what a receiver with the default limits must refuse.

A node sends within the default limits of §9, or its own where its user set smaller ones
(:func:`send_limits`); the engine checks each message against them before writing it
(the pure-Python reference: ``handoff_pure.outgoing``), and a message over one fails that
one send with :class:`~handoff.errors.MessageTooLarge`, naming the limit.
"""

from __future__ import annotations

import dataclasses

from . import wire

__all__ = ["send_limits", "check_type_name"]


def send_limits(limits: wire.Limits) -> wire.Limits:
    """The limits a node sends within: the defaults of §9, or ``limits`` where smaller."""
    d = wire.DEFAULT_LIMITS
    return dataclasses.replace(
        limits,
        max_header_bytes=min(d.max_header_bytes, limits.max_header_bytes),
        max_frames=min(d.max_frames, limits.max_frames),
        max_frame_bytes=min(d.max_frame_bytes, limits.max_frame_bytes),
        max_message_bytes=min(d.max_message_bytes, limits.max_message_bytes),
    )


def check_type_name(type_name: object) -> None:
    """A message's type name is a str (spec §6.4, §10): anything else is a ``TypeError`` here,
    not a header that every receiver refuses."""
    if not isinstance(type_name, str):
        raise TypeError(f"a message's type name is a str, not {type(type_name).__name__}: {type_name!r:.80}")
