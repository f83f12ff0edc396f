"""Verified sessions: resolve providers, apply the fallback policy, report placement."""

from ortpilot.session.fallback import POLICIES, Fallback
from ortpilot.session.options import LEVEL_NAMES, SessionSettings
from ortpilot.session.placement import Placement
from ortpilot.session.verified import VerifiedSession, load

__all__ = ["LEVEL_NAMES", "POLICIES", "Fallback", "Placement", "SessionSettings", "VerifiedSession", "load"]
