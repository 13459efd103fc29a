"""A pytest plugin for scripts/dask-suites: Dask's test modules also under ``distributed.tests``.

Dask's own test files name some of their classes by the dotted path they have in Dask's
repository, e.g. the active memory manager's tests configure the policy
``distributed.tests.test_active_memory_manager.DemoPolicy``, which the scheduler imports by
that name. Dask's wheel ships no ``distributed.tests``, and the files run from
``../shared/dask/suites`` as top-level modules, so the scheduler fails to start and every such
test times out on any scheme. This plugin makes ``distributed.tests.NAME`` the module pytest
already imported as ``NAME`` (the same object, nothing copied), so those paths resolve as in
Dask's repository. Loaded with ``-p dask_suites_alias`` and this folder on ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

PACKAGE = "distributed.tests"


class _Existing(importlib.abc.Loader):
    """Loads a module that is already imported under another name: returns that object."""

    def __init__(self, module: types.ModuleType):
        self._module = module

    def create_module(self, spec):
        return self._module

    def exec_module(self, module):
        pass


class TestsAlias(importlib.abc.MetaPathFinder):
    """Finds ``distributed.tests`` (an empty package) and ``distributed.tests.NAME`` (the
    top-level module ``NAME``, imported if pytest has not yet)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == PACKAGE:
            spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
            spec.submodule_search_locations = []
            return spec
        if not fullname.startswith(PACKAGE + ".") or fullname.count(".") != 2:
            return None
        name = fullname.rsplit(".", 1)[1]
        if not name.startswith("test_"):
            return None
        module = sys.modules.get(name) or importlib.import_module(name)
        return importlib.machinery.ModuleSpec(fullname, _Existing(module))


def pytest_configure(config):
    if not any(isinstance(f, TestsAlias) for f in sys.meta_path):
        sys.meta_path.append(TestsAlias())
