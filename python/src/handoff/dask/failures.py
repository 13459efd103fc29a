"""What a ``handoff://`` comm raises when its connection fails: what Dask's TCP comm raises.

Dask tells a lost peer from a failed task by the exception a comm raises: an ``OSError``
(``CommClosedError`` is one) is a network failure, which it retries or recomputes
elsewhere (``gather_dep`` recomputes a dependency whose holder died); anything else is
the task's error. Dask's TCP comm raises ``CommClosedError("in <comm>: <kind>: <why>")``
whose ``__cause__`` is the ``OSError`` that ended the stream: the socket's own error (a
reset, ``ETIMEDOUT`` from keepalive or the user timeout, a broken pipe) where there was
one, else Tornado's ``StreamClosedError`` (a clean close). :func:`comm_closed` builds the
same from what ended a handoff connection (``Peer.failure``),
so that a comm whose peer died, reset, closed or timed out raises the same class with
the same kind of cause; a handoff-level reason (the peer's ``error`` message, a protocol
error) has no ``OSError`` and gets ``StreamClosedError``, its text in the message.

Pure functions, no I/O.
"""

from __future__ import annotations

from typing import Optional

from distributed.comm.core import CommClosedError
from tornado.iostream import StreamClosedError

__all__ = ["comm_closed", "cause_of"]


def cause_of(failure: Optional[BaseException], error: Optional[BaseException] = None) -> OSError:
    """The ``OSError`` a ``CommClosedError`` names as its cause: ``failure`` (what ended
    the connection) if it is one, else ``error`` if it is one, else a ``StreamClosedError``."""
    for candidate in (failure, error):
        if isinstance(candidate, OSError):
            return candidate
    return StreamClosedError()


def comm_closed(
    where: object, failure: Optional[BaseException], error: Optional[BaseException] = None
) -> CommClosedError:
    """The ``CommClosedError`` for ``where`` (a comm, or the address a connect dialed),
    with :func:`cause_of` as its ``__cause__``: raise it with ``raise e from e.__cause__``.
    ``error`` is the handoff exception that reported the end (its text is kept when the
    cause says less)."""
    cause = cause_of(failure, error)
    if isinstance(cause, StreamClosedError):
        text = f"{cause}" if error is None else f"{cause}: {error}"
    else:
        text = f"{type(cause).__name__}: {cause}"
    exc = CommClosedError(f"in {where}: {text}")
    exc.__cause__ = cause
    return exc
