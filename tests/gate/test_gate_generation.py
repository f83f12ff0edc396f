"""The generation gate's measures (``gate.generation``): log-softmax, KL and the divergence position; the
gate on real decoders runs in tests/decode/test_generation_gate.py."""

from __future__ import annotations

import numpy as np

from ortpilot.gate.generation import divergence_position, kl_divergence, log_softmax


def test_metric_functions() -> None:
    logits = np.random.default_rng(0).standard_normal((4, 50))
    lp = log_softmax(logits)
    assert np.allclose(np.exp(lp).sum(-1), 1.0)
    assert np.allclose(kl_divergence(lp, lp), 0.0)
    other = log_softmax(logits + np.random.default_rng(1).standard_normal((4, 50)))
    assert (kl_divergence(lp, other) > 0).all()
    assert divergence_position([1, 2, 3], [1, 2, 3]) is None
    assert divergence_position([1, 2, 3], [1, 5, 3]) == 1
    assert divergence_position([4], [5]) == 0
