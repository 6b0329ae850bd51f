"""fedowen_strategy/valuation: Shapley-value estimators over utility games (numpy only)."""

from __future__ import annotations

from fedowen_strategy.valuation._base import Valuation
from fedowen_strategy.valuation.registry import ESTIMATORS, estimate

__all__ = ["ESTIMATORS", "Valuation", "estimate"]
