"""``python -m handoff``: the worker (same as ``python -m handoff.worker``)."""

import sys

from .worker import main

sys.exit(main())
