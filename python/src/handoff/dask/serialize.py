"""Route-aware types inside Dask: the ``handoff`` serialization family.

Every type registered with :func:`handoff.route.register` (such as
:class:`handoff.spilled.SpilledFile`) is serialized by Dask with its route-aware
encoder, the route built from what Dask hands a serializer:

- **Encoding.** Dask passes ``context`` to a ``dumps`` that takes it: on a
  ``handoff://`` comm, ``context["handoff"]`` is the comm's route (its two endpoints from
  the authenticated handoff handshake, the locality and the channel, see
  :class:`handoff.dask.comm.HandoffComm`), which becomes a :class:`handoff.route.Route`.
  Without it — ``tcp://`` and other comms, spilling to disk, ``dask.base.tokenize`` —
  the route is :data:`handoff.route.UNKNOWN` (``remote``): the type's self-contained
  form (for ``SpilledFile``, the bytes). If the route-aware form is refused by a bound
  (a pin for a holder that holds its ``max_pins_per_peer``), the value is encoded for
  :data:`~handoff.route.UNKNOWN` instead, with a warning: a task must not fail for it.
- **Decoding.** Dask calls ``loads(header, frames)`` without a context; the handoff comm
  that reads the message makes its inbound route current around Dask's ``from_frames``
  (:meth:`handoff.route.Route.current`; Dask's offload thread inherits it). A value the
  scheduler forwarded without decoding it (``Client.gather`` goes through the scheduler)
  is decoded by the client with the route of the comm it came on, not the one it was
  encoded for: the decoder sees that it is not the holder the value was made for
  (:func:`handoff.pins.hold` returns ``None``) and keeps no pin; the pin made for the
  scheduler ends unclaimed after ``claim_timeout``.

**How it is used, and why this way.** Dask picks a family from the ``serializers`` list of
each call — ``("dask", "pickle")`` unless a caller says otherwise, with no configuration
key for it — so a family nobody lists is never used. Each registered type is therefore
also registered with ``dask_serialize``/``dask_deserialize`` (the ``dask`` family, first
in every default list) with the same functions: that is how Dask's own types (numpy,
pandas) are dispatched, and it works on every comm, handoff or not. The family is also
registered under the name ``handoff`` for callers that list serializers explicitly
(``serializers=["handoff", "dask", "pickle"]``). Types registered later (when their
module is imported, such as while Dask unpickles a task) are added as they come
(:func:`handoff.route.on_register`). The process must import this module: the
``handoff://`` backend does (:mod:`handoff.dask`); on a ``tcp://``-only cluster that never
loads it, a registered type travels by pickle — ``SpilledFile`` pickles as its bytes.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from distributed.protocol.serialize import dask_deserialize, dask_serialize, register_serialization_family

from .. import route as _route
from ..cuda import is_cuda_array, register_frameworks
from ..errors import CapReached
from ..route import UNKNOWN, Route, RouteCodec

__all__ = ["FAMILY", "dumps", "loads", "route_of_context"]

logger = logging.getLogger("distributed.comm.handoff")

#: The name of the serialization family.
FAMILY = "handoff"
_TYPE_KEY = "handoff-type"


def route_of_context(context: Optional[dict]) -> Route:
    """The route of a value Dask serializes with ``context`` (:data:`UNKNOWN` without one)."""
    d = context.get("handoff") if isinstance(context, dict) else None
    if not isinstance(d, dict):
        return UNKNOWN
    return Route.from_dict(d)


def dumps(x: Any, context: Optional[dict] = None) -> tuple:
    """The family's ``dumps``: ``NotImplementedError`` for a type not registered (Dask
    then tries its next family)."""
    if _route.codec_for(x) is None:
        raise NotImplementedError(type(x).__qualname__)
    route = route_of_context(context)
    try:
        name, fields, frames = _route.encode_value(x, route)
    except CapReached as e:
        logger.warning("sending %s as for a remote peer: %s", type(x).__qualname__, e)
        name, fields, frames = _route.encode_value(x, UNKNOWN)
    header = {_TYPE_KEY: name, **fields}
    if any(is_cuda_array(f) for f in frames):
        # GPU memory is neither compressed nor cut into shards: each such frame goes whole,
        # by its IPC handle (spec §7.10), as Dask's own "cuda" family marks its frames.
        header["compression"] = [False if is_cuda_array(f) else None for f in frames]
    return header, frames


def loads(header: dict, frames: list) -> Any:
    """The family's ``loads``: decodes with the current route (the reading comm's)."""
    return _route.decode_value(header.get(_TYPE_KEY), header, frames, Route.current())


def _register_with_dask(codec: RouteCodec) -> None:
    dask_serialize.register(codec.type)(dumps)
    dask_deserialize.register(codec.type)(loads)


register_serialization_family(FAMILY, dumps, loads)
_route.on_register(_register_with_dask)


@dask_serialize.register_lazy("cupy")
@dask_deserialize.register_lazy("cupy")
def _register_cupy() -> None:
    """When Dask first meets a CuPy array: Dask's own CuPy serializers (what its lazy
    registration, which this one takes the place of, would load), then handoff's route-aware
    one for ``cupy.ndarray``, which replaces Dask's in the ``dask`` family: an IPC handle to
    a same-host ``handoff://`` peer that maps them, a host copy elsewhere (spec §7.10)."""
    try:
        from distributed.protocol import cupy as _dask_cupy  # noqa: F401
    except ImportError:  # pragma: no cover - a Dask without CuPy support
        pass
    register_frameworks()
