"""quantmodes: the mode subsets are derived from the one list, so a new mode lands in exactly one of each pair."""

from __future__ import annotations

from ortpilot.passes.quantize import QuantizePass
from ortpilot.passes.weight_only import WeightOnlyPass
from ortpilot.quantmodes import (
    CALIBRATED_MODES,
    DYNAMIC,
    INT8_MODES,
    OPERATOR_MODES,
    QDQ_MODES,
    WEIGHT_ONLY_BITS,
    WEIGHT_ONLY_MODES,
)


def test_int8_subsets_split_the_modes() -> None:
    assert set(QDQ_MODES) | set(OPERATOR_MODES) == set(INT8_MODES)
    assert not set(QDQ_MODES) & set(OPERATOR_MODES)
    assert set(CALIBRATED_MODES) == set(INT8_MODES) - {DYNAMIC}
    assert [QuantizePass(m).calibrated for m in INT8_MODES] == [m in CALIBRATED_MODES for m in INT8_MODES]


def test_weight_only_modes_and_their_bits() -> None:
    assert WEIGHT_ONLY_MODES == ("int4", "int8-weights") and not set(WEIGHT_ONLY_MODES) & set(INT8_MODES)
    assert [WeightOnlyPass(m).bits for m in WEIGHT_ONLY_MODES] == [WEIGHT_ONLY_BITS[m] for m in WEIGHT_ONLY_MODES]
    assert WeightOnlyPass().mode == WEIGHT_ONLY_MODES[0]  # int4 is the default build
