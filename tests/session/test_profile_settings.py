"""``session.profile.profile_settings``: the one check of a profile's session settings (load and export)."""

from __future__ import annotations

import pytest

from ortpilot.errors import UsageError
from ortpilot.session.profile import profile_settings


def test_valid_settings_come_back_as_session_settings():
    settings = profile_settings({"session_settings": {"level": "basic", "intra_op_threads": 2}}, "p.json")
    assert (settings.level, settings.intra_op_threads) == ("basic", 2)


@pytest.mark.parametrize("bad", [5, {"intra_op_threads": "two"}])
def test_malformed_settings_name_the_profile_and_the_fix(bad):
    with pytest.raises(UsageError, match=r"Profile 'p\.json' has invalid session settings .*regenerate it"):
        profile_settings({"session_settings": bad}, "p.json")


def test_an_unknown_level_keeps_its_own_message():
    with pytest.raises(UsageError, match="Unknown optimization level 'fastest'"):
        profile_settings({"session_settings": {"level": "fastest"}}, "p.json")
