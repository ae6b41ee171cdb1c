"""Renderers of a :class:`~torchtriage.diagnosis.result.Diagnosis`: terminal (rich) and JSON."""
