"""Model -> model passes: ORT optimization levels, transformer fusion, quantization.

Each pass returns a ``PassResult`` (new model + record of what changed, stamped); passes
compose into a ``Pipeline``. ``quantize_gated`` (``ortpilot quantize``) adds calibration,
the accuracy gate and the search for the layers that break it.
"""

from ortpilot.passes.base import Pass, PassRecord, PassResult, Pipeline, PipelineResult

__all__ = ["Pass", "PassRecord", "PassResult", "Pipeline", "PipelineResult"]
