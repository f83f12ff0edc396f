"""Search for the fastest configuration that passes the accuracy gate; ship it as a profile.

Importing this package sets the attribute ``ortpilot.tune`` to the package, shadowing the
``ortpilot.tune(...)`` function of the public surface; the package is therefore callable and
forwards to :func:`ortpilot.tune.tune.tune`, so both spellings keep working.
"""

import sys
import types

from ortpilot.tune.tune import TuneResult
from ortpilot.tune.tune import tune as _tune

tune = _tune


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204 - same signature as tune()
        return _tune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["TuneResult", "tune"]
