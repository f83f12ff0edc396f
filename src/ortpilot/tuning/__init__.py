"""Search for the fastest configuration that passes the accuracy gate; ship it as a profile.

The package is ``ortpilot.tuning``; the public entry point is the function ``ortpilot.tune()``
(also importable as ``ortpilot.tuning.tune``).
"""

from ortpilot.tuning.tune import TuneResult, tune

__all__ = ["TuneResult", "tune"]
