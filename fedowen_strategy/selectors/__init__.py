"""Client selection: one module per selector behind one protocol, one table.

- :mod:`~fedowen_strategy.selectors.base`: the protocol (:class:`Selector`: choose, ask
  clients, observe, weigh, state) and what a selector is handed (:class:`Pool`, :class:`Seen`)
  and returns (:class:`Choice`).
- :mod:`~fedowen_strategy.selectors.shared`: what every selector shares, the identity cap and
  the link groups (:class:`SelectionParams`), and a run's :class:`Selection` (the strategy's
  one handle).
- :mod:`~fedowen_strategy.selectors.registry`: :data:`SELECTORS`, one row per selector.
- one module per selector (Algorithm 2's ``adaptive``, the field's peers, FedOwen's
  candidates): the table's rows name them.

docs/selection.md describes each selector and how to add one.
"""

from __future__ import annotations

from fedowen_strategy.selectors.base import (
    AskClients,
    Choice,
    Pool,
    Seen,
    Selector,
    SelectorSettings,
)
from fedowen_strategy.selectors.registry import SELECTORS, SelectorSpec
from fedowen_strategy.selectors.shared import AUTO_CAP, Selection, SelectionParams

__all__ = ["AUTO_CAP", "SELECTORS", "AskClients", "Choice", "Pool", "Seen", "Selection",
           "SelectionParams", "Selector", "SelectorSettings", "SelectorSpec"]
