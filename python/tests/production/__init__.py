"""Production tests: the same program on ``tcp://`` and ``handoff://`` with real Dask
worker processes, asserting that handoff does what TCP does (a package, so that its
conftest does not shadow the suite's)."""
