"""The extension that :mod:`handoff.datasets` runs on: ``handoff-data``, the Rust data layer
the CLI runs too, so that both languages read catalogs, specs and the cache one way. There is
no pure-Python data layer: ``HANDOFF_NATIVE=0`` does not change this one."""

from __future__ import annotations

from ..native import required

native = required("handoff.datasets")

__all__ = ["native"]
