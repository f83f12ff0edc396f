"""Execution provider names that several layers spell: one definition each, at the bottom layer so that
every module (artifacts and graph included) can import it."""

from __future__ import annotations

CPU_EP = "CPUExecutionProvider"
"""ORT's CPU execution provider: always present, the fallback every other EP lands on."""

__all__ = ["CPU_EP"]
