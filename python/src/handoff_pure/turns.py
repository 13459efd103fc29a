"""Taking turns on the event loop: work with a backlog lets newly arrived input go first.

asyncio runs, in each turn of its loop, the callbacks already ready, then those of the
I/O that ``select`` just reported, then the timers that are due. A task that yields with
``asyncio.sleep(0)`` is ready again at once, so in the next turn it runs *before* the
task that the new input woke: a connection with a backlog (or an application loop with
many messages queued) then puts its next slice of work ahead of every other peer's
message, turn after turn, and a sparse peer's round trip grows by a full turn at each
of its steps (read, handle, answer).

:func:`after_new_input` yields through a timer instead: the task resumes after the
callbacks of the input that arrived meanwhile, and after the tasks those woke. A sparse
peer then waits at most for the slice being run when its message arrived (issue 11: a
legitimate peer's round trip during an attack). The backlog loses nothing but a turn.
"""

from __future__ import annotations

import asyncio

__all__ = ["after_new_input"]

#: A delay that is due on the next turn of the loop (any positive one goes through a timer).
_NEXT_TURN = 1e-6


async def after_new_input() -> None:
    """Yields to the event loop, resuming after the input that arrived meanwhile and the
    tasks it woke (see the module's documentation)."""
    await asyncio.sleep(_NEXT_TURN)
