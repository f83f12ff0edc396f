"""Sampling: greedy by default, seeded draws reproducible, cuts that leave one token are greedy."""

from __future__ import annotations

import numpy as np
import pytest

from ortpilot.decode import Sampler, SamplingConfig
from ortpilot.errors import UsageError


def _logits(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((3, 50)).astype(np.float32)


def test_greedy_is_argmax() -> None:
    logits = _logits()
    assert (Sampler()(logits) == logits.argmax(-1)).all()
    assert (Sampler(SamplingConfig(temperature=1.0, top_k=1, seed=3))(logits) == logits.argmax(-1)).all()
    assert (Sampler(SamplingConfig(temperature=1.0, top_p=1e-6, seed=3))(logits) == logits.argmax(-1)).all()


def test_seeded_sampling_is_reproducible_and_random() -> None:
    cfg = SamplingConfig(temperature=1.5, top_k=20, top_p=0.95, seed=7)
    draws = [Sampler(cfg)(_logits(i)) for i in range(20)]
    again = [Sampler(cfg)(_logits(i)) for i in range(20)]
    assert all((a == b).all() for a, b in zip(draws, again))
    assert any((d != _logits(i).argmax(-1)).any() for i, d in enumerate(draws))


def test_top_k_keeps_only_the_k_best() -> None:
    logits = _logits()
    sampler = Sampler(SamplingConfig(temperature=5.0, top_k=3, seed=0))
    top3 = np.argsort(-logits, axis=-1)[:, :3]
    for _ in range(50):
        picked = sampler(logits)
        assert all(picked[r] in top3[r] for r in range(3))


@pytest.mark.parametrize("kwargs", [{"temperature": -1}, {"top_k": -2}, {"top_p": 0.0}, {"top_p": 1.5}])
def test_invalid_settings(kwargs: dict) -> None:
    with pytest.raises(UsageError):
        SamplingConfig(**kwargs)


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1e-30])
def test_broken_logits_raise_instead_of_choosing_a_token(temperature):
    from ortpilot.decode.sampling import Sampler, SamplingConfig
    from ortpilot.errors import SamplingError

    ok = np.array([[0.1, 3.0, -1.0]], dtype=np.float32)
    sampler = Sampler(SamplingConfig(temperature=temperature, seed=1))
    assert sampler(ok)[0] in (0, 1, 2)
    with pytest.raises(SamplingError, match="NaN or infinity"):
        sampler(np.array([[0.1, np.nan, -1.0]], dtype=np.float32))
