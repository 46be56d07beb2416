"""serve.json's schema moved to :mod:`hmt.runtime.settings` (shared with deploy, which must not
import serve); these names stay importable from here."""

from hmt.runtime.settings import (
    ENGINE_CHOICES,
    Budgets,
    CorrectionSettings,
    EarlyExit,
    EstimatorSettings,
    ServeSettings,
)

__all__ = ["ENGINE_CHOICES", "Budgets", "CorrectionSettings", "EarlyExit", "EstimatorSettings", "ServeSettings"]
