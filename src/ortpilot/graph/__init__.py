"""Static facts about a model graph: input shapes, synthetic feeds, FLOPs, a summary.

This layer sits under ``session``: it needs only ``onnx`` and numpy, no running session.
"""
