"""Model -> model passes: ORT optimization levels, transformer fusion, quantization.

Each pass returns a ``PassResult`` (new model + record of what changed, stamped); passes
compose into a ``Pipeline``. A pipeline step as data (what a tune candidate holds) is a
``registry.Step``. Calibration, the accuracy gate and the search for the layers that break it
sit one layer up, in ``ortpilot.gate``.
"""

from ortpilot.passes.base import Pass, PassRecord, PassResult, Pipeline, PipelineResult

__all__ = ["Pass", "PassRecord", "PassResult", "Pipeline", "PipelineResult"]
