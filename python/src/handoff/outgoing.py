"""What a node may send (spec §9): a message's type name is a str. The limits it sends
within are ``Node.send_limits`` (the engine's ``handoff_wire::Limits::for_sending``; the
pure-Python reference's: ``handoff_pure.outgoing``), checked before a message is written.
"""

from __future__ import annotations

__all__ = ["check_type_name"]


def check_type_name(type_name: object) -> None:
    """A message's type name is a str (spec §6.4, §10): anything else is a ``TypeError`` here,
    not a header that every receiver refuses."""
    if not isinstance(type_name, str):
        raise TypeError(f"a message's type name is a str, not {type(type_name).__name__}: {type_name!r:.80}")
