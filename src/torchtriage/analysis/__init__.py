"""Pure functions over a :class:`~torchtriage.trace.Trace`.

Steps, time breakdown, ops, memory, shapes.

Nothing here prints or decides; :mod:`torchtriage.diagnosis` turns these numbers into verdicts.
"""
