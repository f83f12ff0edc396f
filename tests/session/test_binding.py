"""``session.binding.run_session``: the IOBinding path gives the plain path's outputs, by name."""

from __future__ import annotations

import numpy as np
import pytest

from ortpilot.graph.feeds import make_feeds
from ortpilot.session import load
from ortpilot.session.binding import run_session


@pytest.fixture(scope="module")
def decoder(demo_paths):
    """The demo decoder: five outputs, so a dropped or reordered output shows."""
    return load(str(demo_paths["decoder"]), ["CPUExecutionProvider"], "strict")


@pytest.mark.parametrize("iobinding", [False, True])
def test_outputs_match_ort_run_by_name(decoder, iobinding):
    feeds = make_feeds(decoder.model, seed=3)
    names = [o.name for o in decoder.session.get_outputs()]
    expected = dict(zip(names, decoder.session.run(None, feeds)))

    got = run_session(decoder, feeds, iobinding=iobinding)

    assert list(got) == names
    for name in names:
        assert isinstance(got[name], np.ndarray)
        assert got[name].shape == expected[name].shape, name
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=1e-6, err_msg=name)


def test_given_output_names_are_used_as_the_keys(decoder):
    feeds = make_feeds(decoder.model, seed=4)
    names = tuple(o.name for o in decoder.get_outputs())

    got = run_session(decoder, feeds, iobinding=True, output_names=names)

    assert tuple(got) == names
    assert got["logits"].shape == decoder.session.run(["logits"], feeds)[0].shape


def test_feeds_may_be_any_mapping(decoder):
    from types import MappingProxyType

    feeds = make_feeds(decoder.model, seed=5)
    got = run_session(decoder, MappingProxyType(feeds), iobinding=False)
    np.testing.assert_array_equal(got["logits"], run_session(decoder, feeds, iobinding=False)["logits"])
