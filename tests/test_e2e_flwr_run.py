"""Real ``flwr run``s: our SuperLink in simulation mode, Ray, 8 virtual clients, 2 rounds.

Two independent ``flwr run``s with the same run config must select the same clients, compute the
same phi and weights and reach the same accuracy (node ids are random in every run; the strategy
orders nodes by the client ids they report), and the inline backend (no Ray, no SuperLink) must
write the same records. ``flwr run`` exits 0 even when the run failed, so the final status is
read back from the SuperLink and asserted (how a failed status is read: tests/test_launcher.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedowen_deploy.launcher import LocalSuperLink, flwr_run
from server_app.store.records import read_rounds
from sim.inline import inline_run

pytestmark = pytest.mark.e2e
NODES = 8
COMPARED = ("selected", "returned", "phi", "phi_raw", "weights", "n_evals", "nu_empty",
            "nu_full", "test_accuracy", "test_loss")


def _config(data: Path, out: Path) -> dict[str, Any]:
    return {"dataset": "mnist", "data-dir": str(data), "output-dir": str(out),
            "num-server-rounds": 2, "clients-per-round": 4, "client-max-samples": 100,
            "test-max-samples": 1000, "valuation": "owen", "alpha": 0.5}


def _records(out: Path) -> list[dict[str, Any]]:
    return [{k: r.get(k) for k in COMPARED} for r in read_rounds(out)]


def test_flwr_runs_repeat_exactly_and_match_the_inline_backend(shared_data_dir: Path,
                                                               tmp_path: Path) -> None:
    # Prepare
    outs = [tmp_path / name for name in ("flwr-a", "flwr-b", "inline")]
    # Execute: two flwr runs on one SuperLink (fresh random node ids each), one inline run
    with LocalSuperLink(tmp_path / "flwr-home") as link:
        outcomes = [flwr_run(link, _config(shared_data_dir, out), num_supernodes=NODES,
                             timeout=600) for out in outs[:2]]
    outcomes.append(inline_run(None, _config(shared_data_dir, outs[2]), num_supernodes=NODES,
                               timeout=600))
    # Assert: all completed, 2 rounds of 4 clients, and identical records
    for outcome in outcomes:
        assert outcome.ok, f"run ended {outcome.status}:\n{outcome.output[-3000:]}"
    first = _records(outs[0])
    assert [r["selected"] is not None for r in first] == [False, True, True]
    assert all(len(r["returned"]) == 4 for r in first[1:])
    assert all(len(r["phi"]) == 4 for r in first[1:])
    assert _records(outs[1]) == first, "two flwr runs with one config differ"
    assert _records(outs[2]) == first, "the inline backend differs from flwr run"
    for out in outs:
        assert (out / "final_model.pt").is_file() and (out / "summary.json").is_file()
    assert link.process is not None and link.process.poll() is not None  # SuperLink stopped


def test_flower_strategies_swap_in_and_the_bundled_app_runs(shared_data_dir: Path,
                                                             tmp_path: Path) -> None:
    # Prepare: the SuperLink's working directory is another "checkout" whose packages fail on
    # import; Ray workers used to import the ClientApp from there instead of the bundled app
    decoy = tmp_path / "other-checkout"
    for package in ("client_app", "fedowen_task"):
        (decoy / package).mkdir(parents=True)
        (decoy / package / "__init__.py").write_text(
            f"raise ImportError('{package} imported from the wrong checkout')\n")
    base = {"dataset": "mnist", "data-dir": str(shared_data_dir), "num-server-rounds": 2,
            "clients-per-round": 4, "client-max-samples": 100, "test-max-samples": 500}
    runs = {"fedprox": {"proximal-mu": 0.1}, "krum": {"krum-malicious": 1},
            "fedadam": {"strategy-params": "eta=0.01"},
            "fltrust": {"fltrust-root-size": 100}, "foolsgold": {"foolsgold-kappa": 1.0}}
    # Execute: three of Flower's strategies and the two peers (FedAvg subclasses), one SuperLink
    outcomes = {}
    with LocalSuperLink(tmp_path / "flwr-home", cwd=decoy) as link:
        for name, extra in runs.items():
            cfg = {**base, "strategy": name, "output-dir": str(tmp_path / name), **extra}
            outcomes[name] = flwr_run(link, cfg, num_supernodes=6, timeout=600)
    # Assert
    for name, outcome in outcomes.items():
        assert outcome.ok, f"{name}: {outcome.status}\n{outcome.output[-3000:]}"
        assert "wrong checkout" not in outcome.output
        rounds = read_rounds(tmp_path / name)
        assert [r["round"] for r in rounds] == [0, 1, 2]
        assert all(r["strategy"] == name and len(r["returned"]) == 4 and not r["failed"]
                   for r in rounds[1:]), rounds
        assert all(isinstance(r["test_accuracy"], float) for r in rounds)
        if name in ("fltrust", "foolsgold"):  # the weights they applied, per client
            # (sum 0 only in a round FLTrust trusted nobody, which it records)
            assert all(sorted(r["weights"]) == sorted(r["returned"]) and
                       (sum(r["weights"].values()) == pytest.approx(1.0) or "kept_global" in r)
                       for r in rounds[1:])
