"""One run path for a verified session, plain or through IOBinding.

A tune times a candidate with or without IOBinding, and its outputs, the profile's reference
check and a serving replica must come from the same path it was timed on. This is that path,
written once: inputs bound from CPU arrays, every output bound and copied back to CPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ortpilot.session.verified import VerifiedSession


def run_session(
    session: VerifiedSession,
    feeds: Mapping[str, np.ndarray],
    *,
    iobinding: bool,
    output_names: Sequence[str] | None = None,
) -> dict[str, np.ndarray]:
    """All of ``session``'s outputs on ``feeds``, by name, in the model's output order.

    ``output_names`` is the model's output list when the caller already holds it (a replica
    runs per request); it must name every output, in order, as ``session.get_outputs()`` does.
    Without IOBinding this is ``session.run`` (which checks the first feed it sees); with it,
    the inputs are bound as CPU arrays and the outputs copied back to CPU as numpy arrays.
    """
    names = list(output_names) if output_names is not None else [o.name for o in session.get_outputs()]
    if not iobinding or getattr(session, "plan", None) is not None:  # a shape plan's run pads and binds per bucket
        return dict(zip(names, session.run(None, feeds if isinstance(feeds, dict) else dict(feeds))))
    binding = session.session.io_binding()
    for name, value in feeds.items():
        binding.bind_cpu_input(name, value)
    for name in names:
        binding.bind_output(name)
    session.session.run_with_iobinding(binding)
    return dict(zip(names, binding.copy_outputs_to_cpu()))
