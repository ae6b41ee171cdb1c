"""Layer classification and prescriptions.

Numbers from :mod:`torchtriage.analysis` in, a verdict out."""

from torchtriage.diagnosis.diagnose import diagnose
from torchtriage.diagnosis.result import SCHEMA, Diagnosis
from torchtriage.diagnosis.vocabulary import LAYERS, TIME_LAYERS

__all__ = ["LAYERS", "SCHEMA", "TIME_LAYERS", "Diagnosis", "diagnose"]
