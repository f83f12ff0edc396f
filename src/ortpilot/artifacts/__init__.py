"""Artifacts ortpilot writes: atomic files, stamps, the content-addressed cache, profiles."""
