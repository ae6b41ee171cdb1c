"""``python -m torchtriage``."""

from torchtriage.cli import entry_point

entry_point()
