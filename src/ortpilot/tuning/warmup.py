"""The winner's first-run cost at a new input size, measured for the profile's warm-up plan (``session.warmup``).

A fresh session of the winner meets ``PROBE_SIZES`` sizes of the workload's range it has not run yet, twice each;
the median extra time of the first run says whether ``load_profile`` should warm it at the workload's sizes
(OpenVINO: 3.3 ms more at a new MiniLM length, a run 4.1 ms; the CPU EP: a fraction of a millisecond, no
warm-up). Shape plans have none: each bucket is a static session, prepared when it is created.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ortpilot.data.workload import Workload
from ortpilot.session.options import SessionSettings
from ortpilot.session.warmup import (
    WarmupPlan,
    first_run_cost,
    probe_sizes,
    sizes_to_warm,
    warm_request,
    worth_warming,
)

log = logging.getLogger("ortpilot")


def measure_warmup(
    model_file: Path,
    providers: list[dict[str, Any]],
    settings: SessionSettings,
    workload: Workload | None,
    replay: Sequence[Mapping[str, np.ndarray]],
) -> WarmupPlan | None:
    """The profile's warm-up plan for the winner, or None where its requests vary in no single dim (one shape,
    or several dims at once), the tune keeps no replay set to warm from (fewer than 2 requests: ``outputs``
    writes no ``workload.npz`` then), or the measurement failed (logged: the profile is valid without it).

    Measured on the winner's model as ``session.load`` makes it; a profile may load the OpenVINO compiled model or
    ORT's optimized one instead (``load_profile``), which prepares new shapes the same way, not timed here."""
    if workload is None or len(workload.dims) != 1 or len(replay) < 2:
        return None
    from ortpilot.providers.names import resolve_providers
    from ortpilot.session import load

    dim = workload.dims[0]
    name, axis = dim.axes[0]
    sizes = sizes_to_warm(dim.histogram)
    met = [int(np.shape(r[name])[axis]) for r in replay]
    probes = probe_sizes(sizes, met)
    if not probes:
        return None
    request, stacks = warm_request(replay, dim.axes)
    try:
        chain = resolve_providers([(p["name"], dict(p.get("options") or {})) for p in providers])
        session = load(str(model_file), chain, "warn", settings=settings)
        for r in replay:  # what the tune's timing met; the probes are new to it
            session.run(None, dict(r))
        first_ms, run_ms = first_run_cost(session, request, dim.axes, probes)
    except Exception as exc:
        log.info("No warm-up measured for the profile: %s", exc)
        return None
    batches = workload.batches if stacks else (1,)
    return WarmupPlan(dim.name, dim.axes, sizes, first_ms, run_ms, worth_warming(first_ms, run_ms), batches)


__all__ = ["measure_warmup"]
