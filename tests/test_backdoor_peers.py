"""The peers' backdoor filters as defences (issue 72, deliver 2): AlignIns
(:mod:`fedowen_strategy.defences.alignins`) and MultiMetrics
(:mod:`fedowen_strategy.defences.multi_metrics`), on hand-built rounds, inside FedOwen's list
and around Flower's FedAvg."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedowen_strategy.defences import table
from fedowen_strategy.defences.alignins import (
    alignins_keep,
    direction_alignment,
    sign_alignment,
    z_scores,
)
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.defences.guards import guard_round
from fedowen_strategy.defences.multi_metrics import lowest, metric_sums, whitened_scores
from fedowen_strategy.replies import ClientUpdate
from server_app.config import parse_run_config
from tests.peer_rounds import BASE, GLOBAL, around_fedavg


def honest_and_flipped() -> list[ClientUpdate]:
    """c1..c5: ``c x BASE`` (c = 1..5, one direction); c6: ``-BASE`` (flipped)."""
    deltas = [c * BASE for c in range(1, 6)] + [-BASE]
    return [ClientUpdate(i, f"c{i + 1}", {"w": GLOBAL["w"] + d}, 10, 0.0)
            for i, d in enumerate(deltas)]




def test_alignins_measures_by_hand() -> None:
    # Prepare: rows (3, -1, .5, .1), (2, 1, -.5, .1), (1, 2, .5, .1): summed signs (3, 1, 1, 3),
    # majority + everywhere; top 2 by magnitude: {0, 1} in every row
    rows = np.array([[3, -1, .5, .1], [2, 1, -.5, .1], [1, 2, .5, .1]])
    # Execute
    mpsa = sign_alignment(rows, sparsity=0.5)
    tda = direction_alignment(np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]), np.ones(2))
    # Assert: row 0 agrees on 1 of its 2, rows 1 and 2 on both; cosines 1/sqrt2, 1, 0 (a zero
    # update: dot 0 over the floored norm)
    np.testing.assert_allclose(mpsa, [0.5, 1.0, 1.0])
    np.testing.assert_allclose(tda, [1 / math.sqrt(2), 1.0, 0.0])


def test_alignins_thresholds_are_strict_at_their_boundary() -> None:
    # Prepare: values (0, 1): median 0.5, population std 0.5, both z-scores exactly 1
    two = np.array([0.0, 1.0])
    # Execute
    at = alignins_keep(two, np.zeros(2), lambda_c=1.0, lambda_s=1.0)
    above = alignins_keep(two, np.zeros(2), lambda_c=1.0 + 1e-9, lambda_s=1.0)
    sign_at = alignins_keep(np.zeros(2), two, lambda_c=1.0, lambda_s=1.0)
    # Assert: kept only strictly below (the public code's <); equal values: z = 0, all kept
    assert not at.any() and above.all() and not sign_at.any()
    np.testing.assert_array_equal(z_scores(np.full(3, 0.7)), np.zeros(3))


def test_alignins_removes_the_flipped_update_and_clips_to_the_kept_median() -> None:
    # Prepare: TDA t = cos(BASE, 1) for c1..c5 and -t for c6: median t, mean 2t/3, population
    # std t sqrt(5)/3, so c6's z-score is 2t / (t sqrt5 / 3) = 6/sqrt5 = 2.68 and the others'
    # 0; MPSA (top 2 of 4 at sparsity 0.5, majority sign +): 1 for c1..c5, 0 for c6, the same
    # z-scores. Kept norms c sqrt(0.3), c = 1..5: lower median 3 sqrt(0.3)
    guards = Guards(alignins_sparsity=0.5)
    # Execute
    out = guard_round(honest_and_flipped(), GLOBAL, guards, norm_cap="none",
                      value_players=True, defences=table.build("alignins", fedowen=True))
    # Assert: c6 rejected for both; c4 and c5 clipped by 3/4 and 3/5 to norm 3 sqrt(0.3)
    assert list(out.rejected) == ["c6"] and "TDA z-score 2.68" in out.rejected["c6"]
    assert "MPSA z-score 2.68" in out.rejected["c6"]
    record = out.record["alignins"]
    assert record["tda_z"]["c6"] == pytest.approx(6 / math.sqrt(5))
    assert record["mpsa"] == {"c1": 1.0, "c2": 1.0, "c3": 1.0, "c4": 1.0, "c5": 1.0, "c6": 0.0}
    assert record["norm_clip"] == pytest.approx(3 * math.sqrt(0.3), rel=1e-6)
    assert out.clipped == {"c4": pytest.approx(0.75), "c5": pytest.approx(0.6)}
    for upd, c in zip(out.updates, (1, 2, 3, 3, 3), strict=True):
        np.testing.assert_allclose(upd.state["w"] - GLOBAL["w"], c * BASE, rtol=1e-5)


def test_multi_metrics_sums_by_hand() -> None:
    # Prepare: a = (1, 0), b = (0, 1), c = (2, 0)
    rows = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]])
    # Execute
    sums = metric_sums(rows)
    # Assert: squared cosine distances a-b 1, a-c 0, b-c 1; Manhattan a-b 2, a-c 1, b-c 3;
    # length differences a-b 0, a-c 1, b-c 1
    np.testing.assert_allclose(sums, [[1, 3, 1], [2, 5, 1], [1, 4, 2]])


def test_multi_metrics_whitens_each_metric_and_does_not_centre() -> None:
    # Prepare: rows (+-2, 0, 0), (0, +-1, 0), (0, 0, +-1) shifted by (1, 0, 0): covariance
    # diag(8, 2, 2) / 5 (the shift leaves it), its inverse diag(0.625, 2.5, 2.5)
    sums = np.array([[2, 0, 0], [-2, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]],
                    dtype=float) + np.array([1.0, 0.0, 0.0])
    # Execute
    scores = whitened_scores(sums)
    # Assert: 9 x .625, 1 x .625, and .625 + 2.5 for the four others (uncentred t); keep 0.3
    # of 6 = int(1.8) = 1: the lowest alone; never none
    np.testing.assert_allclose(scores, [5.625, 0.625, 3.125, 3.125, 3.125, 3.125])
    np.testing.assert_array_equal(lowest(scores, 0.3), [False, True, False, False, False,
                                                        False])
    assert lowest(scores, 0.1).sum() == 1


def test_multi_metrics_drops_a_scaled_update_inside_fedowens_list() -> None:
    # Prepare: five honest updates near BASE and one BASE x 10 (scaled): its Manhattan and
    # length sums are 5 x 9 x |BASE| more than the honest' (cosine sums alike), the farthest
    # point of the whitened cloud; keep 5/6 of the round
    jitter = np.array([[0, 0, 0, .01], [0, 0, .01, 0], [0, .01, 0, 0], [.01, 0, 0, 0],
                       [0, 0, 0, -.01]], np.float32)
    deltas = [*(BASE + j for j in jitter), 10 * BASE]
    updates = [ClientUpdate(i, f"c{i + 1}", {"w": GLOBAL["w"] + d}, 10, 0.0)
               for i, d in enumerate(deltas)]
    listed = table.build("identity norm-ratio multi-metrics norm-cap links", fedowen=True)
    # Execute
    out = guard_round(updates, GLOBAL, Guards(multi_metrics_keep=0.84), norm_cap="median",
                      value_players=True, defences=listed)
    # Assert: c6 is the one removed (norm 5.5 < 10 x 2: the norm ratio let it through)
    assert list(out.rejected) == ["c6"] and "MultiMetrics: score" in out.rejected["c6"]
    scores = out.record["multi_metrics"]["score"]
    assert max(scores, key=scores.get) == "c6"
    assert [u.client_id for u in out.updates] == ["c1", "c2", "c3", "c4", "c5"]


def test_both_peers_around_flowers_fedavg() -> None:
    # Prepare: the round of test_alignins_removes...: c1..c5 = c x BASE, c6 = -BASE
    deltas = [c * BASE for c in range(1, 6)] + [-BASE]
    # Execute
    aligned, aligned_w = around_fedavg("alignins", Guards(alignins_sparsity=0.5), deltas)
    metric, metric_w = around_fedavg("multi-metrics statistics-rule", Guards(), deltas)
    # Assert: AlignIns: FedAvg averages (1 + 2 + 3 + 3 + 3) / 5 = 2.4 x BASE; MultiMetrics
    # keeps int(0.3 x 6) = 1 update, FedAvg steps by it alone
    np.testing.assert_allclose(aligned_w - GLOBAL["w"], 2.4 * BASE, rtol=1e-5)
    assert list(aligned.round_record["rejected"]) == ["c6"]
    assert aligned.round_record["clipped"] == {"c4": pytest.approx(0.75),
                                               "c5": pytest.approx(0.6)}
    kept = set(metric.round_record["multi_metrics"]["score"]) - set(
        metric.round_record["rejected"])
    (only,) = kept
    np.testing.assert_allclose(metric_w - GLOBAL["w"], deltas[int(only[1:]) - 1], rtol=1e-5)


def test_the_run_config_takes_the_peers_and_names_a_bad_key() -> None:
    # Execute
    cfg = parse_run_config({"defences": "identity norm-ratio alignins multi-metrics norm-cap",
                            "alignins-sparsity": 0.5, "multi-metrics-keep": 0.5})
    # Assert: listed by name (in no auto list); each bad key is one message naming it
    assert cfg.fedowen_arguments()["defences"].split()[2:4] == ["alignins", "multi-metrics"]
    assert "alignins" not in table.FEDOWEN_DEFENCES + table.FLOWER_DEFENCES
    assert table.DEFENCES["alignins"].keys == ("alignins-sparsity", "alignins-lambda-s",
                                               "alignins-lambda-c")
    for key, bad in (("alignins-sparsity", 1.5), ("alignins-lambda-s", 0.0),
                     ("alignins-lambda-c", float("inf")), ("multi-metrics-keep", 0.0)):
        with pytest.raises(ValueError, match=rf"{key}={bad!r} must"):
            parse_run_config({key: bad})
