"""FedOwen: contribution-aware federated learning on Flower.

``fedowen_strategy.valuation`` (Shapley-value estimators over utility games) needs only
numpy. ``FedOwen`` (the Flower strategy), its settings ``ValuationSettings``,
``SelectionParams`` (what every selector shares; each selector's own settings are in
``fedowen_strategy.selectors``) and ``Guards`` (whose defaults are the app's) and
``CoalitionUtility`` (a ready utility for torch models) are imported on first use (a module
``__getattr__``, PEP 562): importing any submodule runs this file first, and ``FedOwen``
needs Flower and ``CoalitionUtility`` torch, which the valuation library must not pull in
(tests/test_architecture.py checks it).

Every module logs through ``logging.getLogger(__name__)``; the ServerApp routes the
``fedowen_strategy`` loggers through Flower's handlers (``server_app.app.route_library_logs``).
Elsewhere configure logging as usual, e.g. ``logging.basicConfig(level=logging.INFO)``.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = ["CoalitionUtility", "FedOwen", "Guards", "SelectionParams", "ValuationSettings"]
_HOME = {"FedOwen": "fedowen_strategy.strategy",
         "ValuationSettings": "fedowen_strategy.round.contribution",
         "SelectionParams": "fedowen_strategy.selectors.shared",
         "Guards": "fedowen_strategy.defences.guard_settings",
         "CoalitionUtility": "fedowen_strategy.torch_utility"}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(import_module(_HOME[name]), name)
    raise AttributeError(f"module 'fedowen_strategy' has no attribute {name!r}")
