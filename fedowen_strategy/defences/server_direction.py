"""The server-direction filter: only updates that point the way of the server's own step.

FLTrust (Cao et al., NDSS 2021) trusts an update by ``ReLU(cos(delta_i, g0))``, ``g0`` one
training step of the server on its own clean set. As a filter in front of FedOwen's valuation
(``update-filter = "server-direction"``), an update whose cosine with the server's step is at
or below zero is rejected before it is valued or averaged: whatever its norm, an update that
does not improve what the server's data asks for gets no weight (a backdoor teaches a trigger
the server's clean data never shows). The server step is the one ``norm-cap = "server"`` uses
(one epoch on the evaluation set, computed once a round). Pure functions of the updates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.updates import cosines_to, flat_delta, update_keys

if TYPE_CHECKING:
    from fedowen_strategy.replies import ClientUpdate


def server_cosines(states: Sequence[Mapping[str, NDArray]], server_state: Mapping[str, NDArray],
                   global_state: Mapping[str, NDArray]) -> NDArray[np.float64]:
    """Each update's cosine with the server's step (0 where either is zero): FLTrust's trust
    score before its ReLU."""
    keys = update_keys(global_state)
    if not states:
        return np.zeros(0)
    deltas = np.stack([flat_delta(state, global_state, keys) for state in states])
    return cosines_to(deltas, flat_delta(server_state, global_state, keys))


def filter_server_direction(updates: Sequence[ClientUpdate], global_state: Mapping[str, NDArray],
                            server_state: Mapping[str, NDArray]
                            ) -> tuple[list[ClientUpdate], dict[str, str], dict[str, float]]:
    """The updates of positive cosine with the server's step; the others as rejected, with
    the reason; and every update's cosine (for the round record)."""
    cos = server_cosines([u.state for u in updates], server_state, global_state)
    kept = [u for u, c in zip(updates, cos, strict=True) if c > 0]
    rejected = {u.client_id: f"cosine {c:.3f} with the server's step is not positive "
                             "(update-filter = server-direction)"
                for u, c in zip(updates, cos, strict=True) if not c > 0}
    return kept, rejected, {u.client_id: round(float(c), 4)
                            for u, c in zip(updates, cos, strict=True)}
