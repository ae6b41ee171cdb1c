"""The typed documents that the orchestration floor produces (run records, A/B, comparison,
fix) and the registry of every document type by schema id.

Models only: nothing here renders (see :mod:`torchtriage.report`) or runs anything (see
:mod:`torchtriage.capture`, :mod:`torchtriage.verify`, :mod:`torchtriage.fix`)."""
