"""benchmarks/bench_duplicates.py spies on the round's copy check by the name the links
defence imports; a rename there must break this test, not the benchmark silently."""

from __future__ import annotations

import numpy as np

import fedowen_strategy.defences.sybil_links as sybil_links
from benchmarks.bench_duplicates import relative_distances
from fedowen_strategy.defences.links import duplicate_groups


def test_the_spied_name_is_the_one_the_links_defence_calls():
    # Assert
    assert sybil_links.duplicate_groups is duplicate_groups


def test_relative_distances_by_hand():
    # Prepare: deltas (3, 4), (3, 4) and (0, 0) to a zero reference
    reference = {"w": np.zeros(2)}
    states = [{"w": np.array([3.0, 4.0])}, {"w": np.array([3.0, 4.0])}, {"w": np.zeros(2)}]
    # Execute
    out = relative_distances(states, reference)
    # Assert: a copy is at 0; an unchanged update is no one's copy (nan)
    assert out[(0, 1)] == 0.0
    assert np.isnan(out[(0, 2)]) and np.isnan(out[(1, 2)])
