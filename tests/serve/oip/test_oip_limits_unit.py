"""serve.oip.limits on the demo encoder's graph: token ids and token types must index their tables from
the start, 0 to rows - 1; a negative id (which ONNX's Gather would read from the end) is refused as the
message says, whatever its size."""

from __future__ import annotations

import numpy as np
import pytest

from ortpilot.errors import InputError
from ortpilot.modelio import load_model
from ortpilot.serve.oip.limits import input_limits


@pytest.fixture(scope="module")
def limits(demo_paths):
    return input_limits(load_model(demo_paths["encoder"], load_external_data=False))


def _feeds(input_ids: int = 1, token_type: int = 0) -> dict[str, np.ndarray]:
    ids = np.full((1, 4), input_ids, np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.full_like(ids, token_type)}


@pytest.mark.parametrize("value", [-1, -5, -1000, -1001])
def test_negative_token_ids_are_refused_with_the_range_the_message_names(limits, value):
    with pytest.raises(InputError, match=f"'input_ids' holds {value}, .* each must be from 0 to 999"):
        limits.check(_feeds(input_ids=value))


def test_negative_token_types_are_refused_and_the_tables_ends_are_taken(limits):
    with pytest.raises(InputError, match="'token_type_ids' holds -1, .* from 0 to 1"):
        limits.check(_feeds(token_type=-1))
    limits.check(_feeds(input_ids=0, token_type=1))
    limits.check(_feeds(input_ids=999))
