"""Measurements: accuracy of one model against another (``compare``), latency, FLOPs.

Each module has one job and is imported directly (``from ortpilot.measure.compare import ...``);
this package imports nothing, so importing one measurement never pulls in the others.
"""
