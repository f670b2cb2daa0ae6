"""`zstalk.workers.testing` before 0.2: kept one release for the tests that import
LocalBroker from here; it lives in zstalk.broker.testing now (the workers package knows
only the protocol, and an in-process broker is the broker's).  The one upward import the
layers table allows (tests/project/test_layout.py), marked to go.
"""
from __future__ import annotations

import warnings


def __getattr__(name: str):
    if name == "LocalBroker":
        warnings.warn("zstalk.workers.testing.LocalBroker moved to zstalk.broker.testing "
                      "(this path goes in the next release)", DeprecationWarning, stacklevel=2)
        from ..broker.testing import LocalBroker
        return LocalBroker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
