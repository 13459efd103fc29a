"""Route-aware types inside Dask: the ``handoff`` serialization family. Every type
registered with :func:`handoff.route.register` is serialized by Dask with its route-aware
encoder: on a ``handoff://`` comm for the comm's route (``context["handoff"]``), elsewhere
for :data:`handoff.route.UNKNOWN`. Each is registered in Dask's ``dask`` family too (the
first of every default list), and under ``handoff``. How encoding and decoding find their
route, and why it is registered so: ``docs/dask.md``, "Route-aware types and datasets
inside Dask".
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
