"""The server-direction filter (fedowen_strategy.defences.server_direction) on hand-built rounds."""

from __future__ import annotations

import numpy as np
import pytest

from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.defences.guards import guard_round
from fedowen_strategy.defences.server_direction import filter_server_direction, server_cosines
from fedowen_strategy.replies import ClientUpdate

GLOBAL = {"w": np.zeros(2), "steps": np.array(3)}
SERVER = {"w": np.array([1.0, 0.0]), "steps": np.array(3)}


def updates(*rows: tuple[float, float]) -> list[ClientUpdate]:
    return [ClientUpdate(i, f"c{i}", {"w": np.array(r), "steps": np.array(3)}, 10, 1.0)
            for i, r in enumerate(rows)]


def test_cosines_with_the_server_step() -> None:
    cos = server_cosines([u.state for u in updates((1, 0), (0, 2), (-3, 0), (1, 1), (0, 0))],
                         SERVER, GLOBAL)
    np.testing.assert_allclose(cos, [1.0, 0.0, -1.0, 1 / np.sqrt(2), 0.0])


def test_an_update_against_or_across_the_server_step_is_rejected_whatever_its_norm() -> None:
    # Prepare: two honest updates along the server's step, one boosted x50 against it, one
    # orthogonal to it, one that drifts but still points its way
    round_ = updates((1, 0.2), (0.8, -0.1), (-50, 5), (0, 1), (3, -2))
    # Execute
    kept, rejected, cosines = filter_server_direction(round_, GLOBAL, SERVER)
    # Assert: the boosted one and the orthogonal one get no weight at all
    assert [u.client_id for u in kept] == ["c0", "c1", "c4"]
    assert set(rejected) == {"c2", "c3"} and "server-direction" in rejected["c2"]
    assert cosines["c2"] < 0 and cosines["c3"] == 0


def test_guard_round_applies_it_and_needs_the_server_step() -> None:
    round_ = updates((1, 0.2), (-50, 5))
    out = guard_round(round_, GLOBAL, Guards(update_filter="server-direction"),
                      norm_cap="median", value_players=True, server_update=lambda: SERVER)
    assert [u.client_id for u in out.updates] == ["c0"] and "c1" in out.rejected
    assert set(out.record["server_cosines"]) == {"c0", "c1"}
    with pytest.raises(ValueError, match="needs server_update"):
        guard_round(round_, GLOBAL, Guards(update_filter="server-direction"),
                    norm_cap="median", value_players=True)
