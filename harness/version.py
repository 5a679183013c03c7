"""The ipa-bench version: one definition, read by pyproject.toml and `ipa-bench --version`."""

__version__ = "0.2.0"
