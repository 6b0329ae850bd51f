"""HiCS-FL's opt-in switch to Fraboni et al.'s clustered sampling (``hics-switch``, the
official code's at 0.1): Algorithm 2 on a hand-built tree, its distinct draws, the switch at
its threshold, ``hics-switch = 0`` drawing as before, and 4 rounds through FedOwen
(tests/test_hics_selector.py: the entropy branch; tests/test_selections_pinned.py: the other
selectors)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.app import MetricRecord

from fedowen_strategy.round.contribution import ValuationSettings
from fedowen_strategy.selectors import hics as hics_module
from fedowen_strategy.selectors.base import Pool, Seen
from fedowen_strategy.selectors.hics import Hics, HicsSettings
from fedowen_strategy.selectors.hics_clustered import (
    clustered_distributions,
    draw_distinct,
    entropy_variance,
    weight_cut_labels,
)
from fedowen_strategy.selectors.hics_estimates import annealed_gamma, hics_pick, skew_entropy
from server_app.store.records import read_rounds
from tests.test_hics import never
from tests.test_hics_selector import reply, run_hics_toy

#: A hand-built tree over 6 clients (scipy's linkage rows: a, b, height, size): {0, 1} -> 6,
#: {2, 4} -> 7, {6, 7} -> 8, {3, 5} -> 9, {8, 9} -> 10; and the clients' data-size shares.
TREE = np.array([[0, 1, 1, 2], [2, 4, 2, 2], [6, 7, 3, 4], [3, 5, 4, 2], [8, 9, 5, 6]], float)
SHARES = np.array([0.1, 0.1, 0.2, 0.22, 0.05, 0.33])


def test_the_tree_is_cut_where_the_merged_share_passes_one_mth() -> None:
    # Execute: m = 3, so clusters of share at most 1/3
    labels = weight_cut_labels(TREE, SHARES, 3)
    # Assert: {0, 1} (0.2) and {2, 4} (0.25) stay merged; {0, 1, 2, 4} (0.45) and {3, 5}
    # (0.55) do not
    assert labels.tolist() == [0, 0, 1, 2, 1, 3]


def test_algorithm_2_keeps_the_m_biggest_clusters_whole_and_fills_the_rest() -> None:
    # Prepare: masses m p = 3 p: {0, 1} 0.6, {2, 4} 0.75, {3} 0.66, {5} 0.99; data sizes 10x
    weights = 10 * SHARES
    # Execute
    rows = clustered_distributions(TREE, weights, 3, np.random.default_rng(0))
    # Assert: each row a distribution; each client's total mass is m times its share
    np.testing.assert_allclose(rows.sum(axis=1), 1.0)
    np.testing.assert_allclose(rows.sum(axis=0), 3 * SHARES)
    # the 3 biggest clusters whole, one a row in increasing mass: {3}, {2, 4}, {5}
    np.testing.assert_allclose(rows[:, 3], [0.66, 0, 0])
    np.testing.assert_allclose(rows[:, [2, 4]], [[0, 0], [0.6, 0.15], [0, 0]], atol=1e-12)
    np.testing.assert_allclose(rows[:, 5], [0, 0, 0.99])
    # {0, 1} fills them in order (shuffled): the first's 0.3 into row 0 (room 0.34), the
    # second's 0.04 there, 0.25 into row 1 (room 0.25), 0.01 into row 2 (room 0.01)
    first, second = (0, 1) if rows[1, 1] > 0 else (1, 0)
    np.testing.assert_allclose(rows[:, first], [0.3, 0, 0], atol=1e-12)
    np.testing.assert_allclose(rows[:, second], [0.04, 0.25, 0.01])


def test_a_client_heavier_than_one_mth_keeps_m_times_its_share() -> None:
    # Prepare: shares 0.6, 0.2, 0.2, m = 2: client 0 alone is a cluster of mass 1.2
    tree = np.array([[1, 2, 1, 2], [0, 3, 2, 3]], float)
    # Execute
    rows = clustered_distributions(tree, np.array([0.6, 0.2, 0.2]), 2, np.random.default_rng(0))
    # Assert: {1, 2} (0.8) in row 0 topped up by client 0's excess 0.2; client 0 fills row 1
    np.testing.assert_allclose(rows, [[0.2, 0.4, 0.4], [1.0, 0, 0]])


def test_draws_are_distinct_and_a_row_without_mass_left_draws_by_size() -> None:
    # Prepare: both rows favour client 0; then client 0 absent and row 1 all on it
    rows = np.array([[1.0, 0, 0], [0.5, 0.5, 0]])
    absent = np.array([[0, 0.5, 0.5], [1.0, 0, 0]])
    # Execute
    picks, by_size = draw_distinct(rows, np.ones(3, bool), np.random.default_rng(0))
    picks2, by_size2 = draw_distinct(absent, np.array([False, True, True]),
                                     np.random.default_rng(0))
    # Assert: row 1 redraws without client 0; in the second, row 1 has no available mass
    # and draws by the column sums (0.5 each on 1 and 2) among those left
    assert picks.tolist() == [0, 1] and by_size == 0
    assert sorted(picks2.tolist()) == [1, 2] and by_size2 == 1
    with pytest.raises(ValueError, match="cannot draw 2 distinct of 1"):
        draw_distinct(rows, np.array([True, False, False]), np.random.default_rng(0))


#: Bias updates per unit step over C = 4: a one-label client (entropy 0 at T = 0.03: the
#: softmax underflows to one-hot) and a zero update (entropy ln 4).
PEAKED, FLAT = [100.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]


def estimated(switch: float, examples: dict[str, float] | None = None) -> Hics:
    """A Hics past its warm-up over c0-c4: c0, c2 one-label, c1, c3 flat, c4 selected
    without an accepted update (no estimate: not in the variance)."""
    hics = Hics(HicsSettings(hics_switch=switch, hics_rounds=10))
    hics.updates = {"c0": PEAKED, "c1": FLAT, "c2": PEAKED, "c3": FLAT}
    hics.tried = {"c0", "c1", "c2", "c3", "c4"}
    hics.examples = dict(examples or {})
    return hics


KEYS = ("c0", "c1", "c2", "c3", "c4")


def test_the_switch_fires_at_its_threshold_and_not_below() -> None:
    # Prepare: entropies 0, ln 4, 0, ln 4: variance (ln 2)^2 = 0.4805 (c4's ln 4 left out)
    variance = entropy_variance(skew_entropy(np.array([PEAKED, FLAT, PEAKED, FLAT]), 0.03))
    assert variance == pytest.approx(np.log(2) ** 2, rel=1e-12)
    # Execute: the threshold exactly at the variance, and one float above it
    at = estimated(variance).choose(Pool(KEYS, 2, 5), np.random.default_rng(1), never)
    above = estimated(float(np.nextafter(variance, np.inf))).choose(
        Pool(KEYS, 2, 5), np.random.default_rng(1), never)
    # Assert
    assert at.record is not None and above.record is not None
    assert at.record["branch"] == "clustered" and above.record["branch"] == "entropy"
    assert at.record["variance"] == above.record["variance"] == round(np.log(2) ** 2, 6)
    assert len(set(at.indices.tolist())) == 2 and at.how == "hics-fl"


def test_hics_switch_0_draws_as_the_entropy_branch_alone() -> None:
    # Prepare: a variance far above any threshold the code would use
    hics, rng, again = estimated(0.0), np.random.default_rng(7), np.random.default_rng(7)
    _, matrix = hics.known()
    assert matrix is not None
    # Execute
    choice = hics.choose(Pool(KEYS, 3, 5), rng, never)
    drawn, info = hics_pick(matrix, np.ones(5, bool), 3, 3, annealed_gamma(4.0, 5, 10),
                            0.03, 10.0, again)
    # Assert: the same clients and the same generator state as HiCS-FL's draw alone
    assert choice.indices.tolist() == drawn.tolist()
    assert rng.bit_generator.state == again.bit_generator.state
    assert choice.record is not None and choice.record["branch"] == "entropy"
    assert {k: choice.record[k] for k in info} == info


def test_clustered_weights_are_the_last_num_examples_and_the_mean_without(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: c0 sent 30, c1 10, c2 and c3 none (the mean, 20); c4 reports 50 in round 1
    seen: dict[str, Any] = {}
    real = hics_module.clustered_pick

    def spy(updates: Any, weights: Any, *args: Any) -> Any:
        seen["weights"] = weights.tolist()
        return real(updates, weights, *args)

    monkeypatch.setattr(hics_module, "clustered_pick", spy)
    hics = estimated(0.1, {"c0": 30.0, "c1": 10.0})
    zero = {"fc.weight": np.zeros((4, 2)), "fc.bias": np.zeros(4)}
    late = reply([0.0, 0.0, 0.0, 0.0], 1.0)
    late["metrics"] = MetricRecord({"num-examples": 50, "step-scale": 1.0})
    hics.observe(Seen(4, ("c4",), None, (late,), (zero,), zero))
    # Execute
    hics.choose(Pool(KEYS, 2, 5), np.random.default_rng(0), never)
    # Assert: rows c0-c4, the mean of 30, 10 and 50 for c2 and c3
    assert hics.examples == {"c0": 30.0, "c1": 10.0, "c4": 50.0}
    assert seen["weights"] == [30.0, 10.0, 30.0, 30.0, 50.0]
    assert hics.state()["examples"] == hics.examples


def test_four_rounds_through_fedowen_record_the_branch(tmp_path: Any) -> None:
    # Prepare: the toy of tests/test_hics_selector.py (4 one-label clients, 2 balanced), 2 a
    # round, hics-switch = 0.1 (the code's): 3 warm-up rounds, then one by the entropies
    # Execute
    run_hics_toy(HicsSettings(hics_rounds=4, hics_switch=0.1), 4, tmp_path,
                 ValuationSettings(method="none", aggregation="uniform"))
    # Assert: the warm-up records no branch; round 4's one-label / balanced mix is far above
    # 0.1 (about 0.43 were the estimates exact), so Fraboni's draw ran, of 2 distinct clients
    rounds = read_rounds(tmp_path)[1:]
    assert [r["selection"].get("branch") for r in rounds] == [None] * 3 + ["clustered"]
    assert rounds[3]["selection"]["variance"] >= 0.1
    assert len(set(rounds[3]["selected"])) == 2
