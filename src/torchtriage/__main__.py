"""``python -m torchtriage``."""

from torchtriage.cli import run

run()
