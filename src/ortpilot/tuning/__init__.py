"""Search for the fastest configuration that passes the accuracy gate; ship it as a profile.

The package is ``ortpilot.tuning``; the public entry point is the function ``ortpilot.tune()``
(also importable as ``ortpilot.tuning.tune``), which takes a ``TuneRequest`` or its fields.
"""

from ortpilot.tuning.request import TuneRequest
from ortpilot.tuning.tune import TuneResult, tune

__all__ = ["TuneRequest", "TuneResult", "tune"]
