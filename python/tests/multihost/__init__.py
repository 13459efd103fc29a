"""Multi-host tests: real nodes on the hosts of a network-namespace lab (a package, so that its
conftest does not shadow the suite's)."""
