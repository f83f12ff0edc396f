"""What an export cannot carry over, each with what it costs, so nothing is dropped silently."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Loss:
    """One setting the verified profile had that the target cannot express (or does differently)."""

    setting: str  # the profile's field, e.g. "session_settings.config_entries[session.intra_op.allow_spinning]"
    value: str  # what the profile said
    consequence: str  # what happens instead on the target, and what to do about it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def losses_markdown(losses: list[Loss]) -> str:
    """The "what is lost" list as Markdown bullets (ORTPILOT.md and the docs use the same wording)."""
    if not losses:
        return "Nothing: every setting of the profile is expressed in config.pbtxt.\n"
    return "".join(f"- **{loss.setting}** = `{loss.value}`: {loss.consequence}\n" for loss in losses)
