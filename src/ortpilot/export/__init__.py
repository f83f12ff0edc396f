"""Deployment exports: a verified profile as a Triton model repository (and a KServe manifest).

Above ``tune`` beside ``serve``: it reads profiles and never changes them. tritonclient (Triton's
protobuf classes, which parse and check the written config) and PyYAML (the manifest) come from
the ``export`` extra and are imported only when an export runs.
"""

from ortpilot.export.losses import Loss
from ortpilot.export.triton import ExportResult, export_triton, export_triton_bundle

__all__ = ["ExportResult", "Loss", "export_triton", "export_triton_bundle"]
