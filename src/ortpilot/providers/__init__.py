"""Provider names, options and gotchas; plugin EP discovery; the environment doctor."""

from ortpilot.providers.names import (
    PROVIDER_ALIASES,
    ProviderSpec,
    parse_provider_arg,
    resolve_providers,
)

__all__ = ["PROVIDER_ALIASES", "ProviderSpec", "parse_provider_arg", "resolve_providers"]
