"""Moved to :mod:`hmt.runtime.settings`; kept so imports of ``hmt.serve.config`` keep working."""

from hmt.runtime.settings import dataclass_from_mapping

__all__ = ["dataclass_from_mapping"]
