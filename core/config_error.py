"""The one error every configuration check raises (core/config.py and the files it reads through)."""


class ConfigError(ValueError):
    """A configuration that cannot be served; the message says what to change."""
