"""Profiling sessions: run torch.profiler with torchtriage's defaults and keep what it records."""

from torchtriage.capture.session import ProfileSession, profile

__all__ = ["ProfileSession", "profile"]
