"""Layer classification and prescriptions: numbers from :mod:`torchtriage.analysis` in, a
verdict out.

The package imports nothing, so that any one module (the models in ``result``, the
thresholds, the catalog) loads without the rest. Entry points: ``diagnose.diagnose`` (one
loaded trace) and ``traces.diagnose_traces`` (files: one diagnosis or a job's).
"""
