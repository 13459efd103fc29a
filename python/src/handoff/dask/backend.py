"""``HandoffBackend``: the ``handoff`` scheme of ``distributed.comm`` (address handling as TCP's).

The first connector or listener of a process starts :mod:`handoff.dask.memory` (the
``handoff`` worker metric, and memory held for reuse given back under pressure)."""

from __future__ import annotations

from distributed.comm.addressing import parse_host_port, unparse_host_port
from distributed.comm.registry import Backend
from distributed.utils import ensure_ip, get_ip

from . import memory
from .connector import HandoffConnector
from .listener import HandoffListener

__all__ = ["HandoffBackend"]


class HandoffBackend(Backend):
    """Dask's comm backend for ``handoff://host:port`` addresses."""

    def get_connector(self) -> HandoffConnector:
        memory.start()  # the shared bytes reported to Dask, and given back under pressure
        return HandoffConnector()

    def get_listener(self, loc, handle_comm, deserialize, **connection_args) -> HandoffListener:
        memory.start()
        return HandoffListener(loc, handle_comm, deserialize, **connection_args)

    def get_address_host(self, loc: str) -> str:
        return parse_host_port(loc)[0]

    def get_address_host_port(self, loc: str) -> tuple:
        return parse_host_port(loc)

    def resolve_address(self, loc: str) -> str:
        host, port = parse_host_port(loc)
        return unparse_host_port(ensure_ip(host), port)

    def get_local_address_for(self, loc: str) -> str:
        host, _ = parse_host_port(loc)
        return unparse_host_port(get_ip(ensure_ip(host)), None)
