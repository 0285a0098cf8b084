"""Parse and format human-readable durations (see README.md)."""
from .core import format_duration, parse_duration

__all__ = ["parse_duration", "format_duration"]
