"""FedOwen: contribution-aware federated learning on Flower.

``fedowen_strategy.valuation`` (Shapley-value estimators over utility games) needs only
numpy. ``FedOwen`` and ``ValuationSettings`` (the Flower strategy and its valuation settings)
and ``CoalitionUtility`` (a ready utility for torch models) are imported lazily, so that
importing the valuation library pulls in neither Flower nor torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = ["CoalitionUtility", "FedOwen", "ValuationSettings"]
_HOME = {"FedOwen": "fedowen_strategy.strategy",
         "ValuationSettings": "fedowen_strategy.contribution",
         "CoalitionUtility": "fedowen_strategy.torch_utility"}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(import_module(_HOME[name]), name)
    raise AttributeError(f"module 'fedowen_strategy' has no attribute {name!r}")
