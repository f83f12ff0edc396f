"""data.pooling: every sentence-transformers pooling mode against a per-sentence numpy reference, with padding
filled with large values that must not reach the result; normalization and activations."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from ortpilot.data.pooling import POOLING_MODES, activate, normalize, pool, pool_mode, pooling_modes

LENGTHS = [5, 2, 7, 1]
SEQ, DIM = 7, 6


def _batch() -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Token vectors [4, 7, 6] whose padded positions hold 1000s, their mask, and each sentence's real tokens."""
    rng = np.random.default_rng(0)
    real = [rng.standard_normal((n, DIM)).astype(np.float32) for n in LENGTHS]
    tokens = np.full((len(LENGTHS), SEQ, DIM), 1000.0, dtype=np.float32)
    mask = np.zeros((len(LENGTHS), SEQ), dtype=np.int64)
    for row, values in enumerate(real):
        tokens[row, : len(values)] = values
        mask[row, : len(values)] = 1
    return tokens, mask, real


def _reference(real: np.ndarray, mode: str) -> np.ndarray:
    """One sentence's pooled vector from its real tokens alone (sentence-transformers' formulas)."""
    n = len(real)
    if mode == "cls_token":
        return real[0]
    if mode == "lasttoken":
        return real[-1]
    if mode == "max_tokens":
        return real.max(axis=0)
    if mode == "mean_tokens":
        return real.sum(axis=0) / n
    if mode == "mean_sqrt_len_tokens":
        return real.sum(axis=0) / np.sqrt(n)
    weights = np.arange(1, n + 1, dtype=np.float32)[:, None]
    return (real * weights).sum(axis=0) / weights.sum()


@pytest.mark.parametrize("mode", POOLING_MODES)
def test_each_mode_matches_the_reference_and_padding_does_not_leak(mode: str) -> None:
    tokens, mask, real = _batch()
    got = pool_mode(tokens, mask, mode)
    assert got.shape == (len(LENGTHS), DIM) and got.dtype == np.float32
    for row, values in enumerate(real):
        np.testing.assert_allclose(got[row], _reference(values, mode), rtol=1e-5, atol=1e-5)
    assert np.abs(got).max() < 100  # none of the 1000s on the padding got in


def test_several_modes_concatenate_in_sentence_transformers_order() -> None:
    tokens, mask, _ = _batch()
    got = pool(tokens, mask, ["mean_tokens", "cls_token"])
    expected = np.concatenate([pool_mode(tokens, mask, "cls_token"), pool_mode(tokens, mask, "mean_tokens")], axis=1)
    np.testing.assert_array_equal(got, expected)
    with pytest.raises(ValueError, match="unknown pooling mode"):
        pool_mode(tokens, mask, "median")
    with pytest.raises(ValueError, match="do not match"):
        pool_mode(tokens, mask[:, :3], "mean_tokens")


def test_float16_token_vectors_are_pooled_in_float32() -> None:
    tokens, mask, real = _batch()
    got = pool(tokens.astype(np.float16), mask, ["mean_tokens"])
    assert got.dtype == np.float32
    np.testing.assert_allclose(got[0], real[0].mean(axis=0), atol=2e-3)


def test_pooling_modes_takes_sentence_transformers_names() -> None:
    assert pooling_modes("mean") == ("mean_tokens",)
    assert pooling_modes("mean, CLS") == ("cls_token", "mean_tokens")
    assert pooling_modes(["lasttoken", "weightedmean_tokens"]) == ("weightedmean_tokens", "lasttoken")
    with pytest.raises(ValueError, match=r"unknown pooling 'median'.*mean"):
        pooling_modes("median")


def test_normalize_gives_unit_rows_and_leaves_a_zero_row_zero() -> None:
    out = normalize(np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32))
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0]])


def test_activations_without_overflow() -> None:
    logits = np.array([[-1000.0, 0.0, 1000.0], [1.0, 2.0, 3.0]], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sig = activate(logits, "sigmoid")
        soft = activate(logits, "softmax")
    np.testing.assert_allclose(sig[0], [0.0, 0.5, 1.0])
    np.testing.assert_allclose(sig[1], 1 / (1 + np.exp(-logits[1])), rtol=1e-6)
    np.testing.assert_allclose(soft.sum(axis=1), [1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(soft[1], np.exp(logits[1]) / np.exp(logits[1]).sum(), rtol=1e-6)
    np.testing.assert_array_equal(activate(logits, "none"), logits)
    with pytest.raises(ValueError, match="unknown activation"):
        activate(logits, "relu")
