"""Errors the scheduler library raises for configuration it refuses.

A configuration that could strand work (a trajectory that could never be placed) is
refused before a run starts, never discovered as a hung run.
"""


class ConfigError(ValueError):
    """A snapshot, knob or pool that the scheduler cannot run with; the message says why."""


class StrandingError(ConfigError):
    """A pool on which some trajectory could never be placed."""
