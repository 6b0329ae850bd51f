"""The payout ledger: hand-computed intervals, widths by rounds valued, the CLI on a run dir."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedowen_strategy.payouts import payouts
from server_app.store.payouts import run_payouts
from server_app.store.records import RunRecorder
from sim.ledger import main as ledger_main
from tests.test_strategy import run_toy

T_0975_DF1 = 12.706204736174707  # scipy.stats.t.ppf(0.975, 1)


def test_ledger_by_hand() -> None:
    # Prepare: x valued twice (1, 3), y once (2), z once (-4)
    rows = {p.client_id: p for p in payouts({"x": [1.0, 3.0], "y": [2.0], "z": [-4.0]},
                                            {"x": 2, "y": 3, "z": 1})}
    # Assert: x's own spread: mean 2, sd sqrt(2), half = t(0.975, 1) sqrt(2) / sqrt(2)
    x, y, z = rows["x"], rows["y"], rows["z"]
    assert (x.mean_phi, x.total_phi, x.ci_from) == (2.0, 4.0, "own")
    assert x.ci_high - x.mean_phi == pytest.approx(T_0975_DF1)
    assert x.total_ci_high - x.total_phi == pytest.approx(2 * T_0975_DF1)
    # y and z have no spread of their own: pooled sd sqrt(2) with x's one degree of freedom
    assert y.ci_from == "pooled" and y.ci_high - 2.0 == pytest.approx(T_0975_DF1 * math.sqrt(2))
    # ranks by total phi; the pool is the non-negative part: 4 and 2 of 6
    assert (x.rank, y.rank, z.rank) == (1, 2, 3)
    assert (x.payout_share, y.payout_share, z.payout_share) == pytest.approx((2 / 3, 1 / 3, 0))
    assert y.rounds_selected == 3 and y.rounds_valued == 1  # selected 3 times, returned once
    assert not z.ci_below_zero  # -4 +- 18: the interval reaches above zero


def _records(rng: np.random.Generator) -> list[dict[str, Any]]:
    """20 rounds: 'often' and 'bad' valued every round, 'once' only in round 1; the phi of
    'often' and 'once' drawn from one distribution, 'bad' clearly negative."""
    recs = []
    for r in range(1, 21):
        phi = {"often": rng.normal(0.1, 0.05), "bad": rng.normal(-0.2, 0.05)}
        if r == 1:
            phi["once"] = rng.normal(0.1, 0.05)
        recs.append({"round": r, "selected": list(phi), "phi": phi, "valuation": "owen"})
    return recs


def test_a_client_valued_once_gets_a_wider_interval_than_one_valued_twenty_times() -> None:
    rng = np.random.default_rng(0)
    for _ in range(5):  # on several draws of the same data
        values: dict[str, list[float]] = {}
        for rec in _records(rng):
            for cid, v in rec["phi"].items():
                values.setdefault(cid, []).append(v)
        rows = {p.client_id: p for p in payouts(values)}
        once, often, bad = rows["once"], rows["often"], rows["bad"]
        assert once.ci_high - once.ci_low > 3 * (often.ci_high - often.ci_low)
        assert once.ci_low < once.mean_phi < once.ci_high
        assert bad.ci_below_zero and not often.ci_below_zero and bad.payout_share == 0.0
        assert often.payout_share + once.payout_share == pytest.approx(1.0)


def test_ledger_command_on_a_recorded_run_marks_the_adversaries(tmp_path: Path) -> None:
    # Prepare: a FedOwen run recorded by the strategy itself (toy task: c4 and c5 push the
    # model away from the target), with the ServerApp's adversaries.json
    run_toy("owen", rounds=8, tmp_path=tmp_path)
    RunRecorder(tmp_path).write_json("adversaries.json", {"ids": ["c4", "c5"]})
    out = tmp_path / "ledger-out"
    # Execute
    assert ledger_main([str(tmp_path), "--out", str(out)]) == 0
    # Assert: one row per client, adversaries marked and ranked last, a plot
    with (out / "payouts.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(r["client_id"] for r in rows) == [f"c{i}" for i in range(6)]
    assert {r["client_id"] for r in rows if r["adversary"] == "True"} == {"c4", "c5"}
    assert {r["client_id"] for r in rows[-2:]} == {"c4", "c5"}
    assert all(int(r["rounds_valued"]) == 8 for r in rows)
    assert sum(float(r["payout_share"]) for r in rows) == pytest.approx(1.0, abs=1e-5)
    assert (out / "payouts.png").stat().st_size > 1000


def test_ledger_refuses_runs_without_contributions(tmp_path: Path) -> None:
    recorder = RunRecorder(tmp_path)
    recorder.log_train(1, {"selected": ["a"], "phi": {"a": 0.0}, "valuation": "none"}, [])
    recorder.log_eval(1, {"test_accuracy": 0.5})
    with pytest.raises(ValueError, match="records no 'phi'"):
        run_payouts(tmp_path)
    assert ledger_main([str(tmp_path)]) == 2


def test_forfeited_clients_keep_their_losses_not_their_gains() -> None:
    rows = {p.client_id: p for p in payouts({"x": [1.0, 3.0], "s": [5.0], "t": [-2.0]},
                                            forfeited=["s", "t"])}
    x, s, t = rows["x"], rows["s"], rows["t"]
    assert (s.total_phi, s.paid_phi, t.paid_phi) == (5.0, 0.0, -2.0)
    assert (x.rank, s.rank, t.rank) == (1, 2, 3)
    assert (x.payout_share, s.payout_share, t.payout_share) == (1.0, 0.0, 0.0)
    assert s.forfeited and t.forfeited and not x.forfeited
