"""FLAME's filter (fedowen_strategy.defences.majority) on hand-built rounds."""

from __future__ import annotations

import numpy as np
import pytest

from fedowen_strategy.defences.majority import (
    clip_to_median,
    cosine_distances,
    flame_noise,
    majority_cluster,
)


def honest_round(rng: np.random.Generator, n: int = 8, dim: int = 50) -> np.ndarray:
    """``n`` honest updates: a shared direction plus client-specific spread."""
    shared = np.ones(dim)
    return np.stack([shared + 0.6 * rng.normal(size=dim) for _ in range(n)])


def test_a_boosted_minority_pointing_away_is_left_out() -> None:
    # Prepare: 8 honest updates, 2 attackers sharing a direction of their own, boosted x10
    rng = np.random.default_rng(0)
    trigger = rng.normal(size=50)
    attackers = np.stack([10 * (trigger + 0.1 * rng.normal(size=50)) for _ in range(2)])
    flat = np.vstack([honest_round(rng), attackers])
    # Execute
    keep = majority_cluster(flat)
    # Assert: both attackers out (weight 0 <= an honest weight); a strict majority of the
    # honest updates kept (HDBSCAN leaves honest outliers out too, as FLAME does)
    assert not keep[8:].any() and keep[:8].sum() >= 6


def test_an_all_honest_round_keeps_a_majority_and_tiny_rounds_are_not_filtered() -> None:
    rng = np.random.default_rng(1)
    assert majority_cluster(honest_round(rng, n=10)).sum() >= 6
    assert majority_cluster(rng.normal(size=(2, 5))).all()


def test_distances_clipping_and_noise_by_hand() -> None:
    flat = np.array([[1.0, 0.0], [0.0, 2.0], [-3.0, 0.0], [0.0, 0.0]])
    d = cosine_distances(flat)
    assert d[0, 1] == pytest.approx(1.0) and d[0, 2] == pytest.approx(2.0)
    assert d[0, 0] == pytest.approx(0.0) and d[3, 0] == pytest.approx(1.0)
    factors, median = clip_to_median(np.array([1.0, 2.0, 4.0]))
    assert median == 2.0 and factors.tolist() == [1.0, 1.0, 0.5]
    noise = flame_noise((10000,), 2.0, np.random.default_rng(0), level=0.5)
    assert noise.std() == pytest.approx(1.0, rel=0.03)


def test_the_majority_filter_rejects_a_backdoor_minority_in_a_round() -> None:
    # Prepare: the hand-built round above as client updates to a zero global model
    from fedowen_strategy.defences.guard_settings import Guards
    from fedowen_strategy.defences.guards import guard_round
    from fedowen_strategy.replies import ClientUpdate

    rng = np.random.default_rng(0)
    trigger = rng.normal(size=50)
    flat = np.vstack([honest_round(rng),
                      *[10 * (trigger + 0.1 * rng.normal(size=50)) for _ in range(2)]])
    updates = [ClientUpdate(i, f"c{i}", {"w": row}, 10, 1.0) for i, row in enumerate(flat)]
    # Execute
    out = guard_round(updates, {"w": np.zeros(50)}, Guards(update_filter="majority"),
                      norm_cap="median", value_players=True)
    off = guard_round(updates, {"w": np.zeros(50)}, Guards(), norm_cap="median",
                      value_players=True)
    # Assert: both attackers rejected with the reason, the honest majority kept; off by default
    assert {"c8", "c9"} <= set(out.rejected) and "majority" in out.rejected["c8"]
    assert len(out.updates) >= 6 and not off.rejected
