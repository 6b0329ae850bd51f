"""A real ``flwr run``: our SuperLink in simulation mode, Ray, 10 virtual clients, 2 rounds.

``flwr run`` exits 0 even when the run failed, so the final status is read back from the
SuperLink and asserted, as are the records the ServerApp wrote.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedowen_strategy.records import read_rounds
from sim.launcher import LocalSuperLink, flwr_run

pytestmark = pytest.mark.e2e


def test_flwr_run_completes_two_rounds(shared_data_dir: Path, tmp_path: Path) -> None:
    # Prepare
    out = tmp_path / "out"
    run_config = {"dataset": "mnist", "data-dir": str(shared_data_dir), "output-dir": str(out),
                  "num-server-rounds": 2, "clients-per-round": 4, "client-max-samples": 100,
                  "test-max-samples": 1000, "valuation": "owen"}
    # Execute
    with LocalSuperLink(tmp_path / "flwr-home") as link:
        outcome = flwr_run(link, run_config, num_supernodes=10, timeout=600)
    # Assert
    assert outcome.ok, f"run {outcome.run_id} ended {outcome.status}:\n{outcome.output[-3000:]}"
    rounds = read_rounds(out)
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert all(len(r["returned"]) == 4 for r in rounds[1:])
    assert (out / "final_model.pt").is_file() and (out / "summary.json").is_file()
    assert link.process is not None and link.process.poll() is not None  # SuperLink stopped


def test_failed_run_is_reported_as_failed(shared_data_dir: Path, tmp_path: Path) -> None:
    # A run config the ServerApp refuses must surface as a failed status, not as success
    run_config = {"dataset": "no-such-dataset", "data-dir": str(shared_data_dir),
                  "output-dir": str(tmp_path / "out"), "num-server-rounds": 1}
    with LocalSuperLink(tmp_path / "flwr-home") as link:
        outcome = flwr_run(link, run_config, num_supernodes=2, timeout=300)
    assert not outcome.ok and outcome.status.startswith("finished:failed"), outcome.status
