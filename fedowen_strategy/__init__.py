"""FedOwen: contribution-aware federated learning on Flower.

``fedowen_strategy.valuation`` (Shapley-value estimators over utility games) needs only
numpy; ``FedOwen`` (the Flower strategy) is imported lazily so that importing the valuation
library never pulls in Flower.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FedOwen"]


def __getattr__(name: str) -> Any:
    if name == "FedOwen":
        from fedowen_strategy.strategy import FedOwen

        return FedOwen
    raise AttributeError(f"module 'fedowen_strategy' has no attribute {name!r}")
