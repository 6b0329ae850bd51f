"""Ablation presets: variants, parallel inline cells (runner faked), paired-CI report."""

from __future__ import annotations

import csv
import json
import math
import threading
from pathlib import Path
from typing import Any

import pytest

from sim.cell_state import read_state
from sim.compact import open_csv
from sim.grid import app_config
from sim.presets import PresetError, parse_preset
from sim.report import write_report
from sim.runner import Runner
from sim.stats import mean_interval, paired_interval
from tests.fake_runner import VARIANTS, FakeFlwr, ablation_preset, fake_link, write_rounds


def test_intervals_by_hand() -> None:
    # mean 2, sd 1, t(0.975, 2) = 4.3027 -> half-width 4.3027 / sqrt(3)
    iv = mean_interval([1.0, 2.0, 3.0])
    assert iv.mean == pytest.approx(2.0) and iv.half == pytest.approx(4.3027 / math.sqrt(3),
                                                                      rel=1e-4)
    assert iv.lo == pytest.approx(2.0 - iv.half) and not iv.excludes_zero  # lo = -0.48
    assert mean_interval([1.0, 1.1, 0.9]).excludes_zero
    # paired on the shared seeds 0 and 1 only: differences 1 and 2
    diff = paired_interval({0: 1.0, 1: 3.0, 2: 9.0}, {0: 0.0, 1: 1.0})
    assert diff.n == 2 and diff.mean == pytest.approx(1.5)
    assert diff.half == pytest.approx(12.7062 * math.sqrt(0.5) / math.sqrt(2), rel=1e-4)
    assert not diff.excludes_zero
    assert mean_interval([5.0]).text() == "5.00 (n=1)" and mean_interval([]).text() == "-"


def test_variants_expand_to_their_keys_and_validate() -> None:
    # Execute
    cells = parse_preset(ablation_preset()).cells()
    # Assert: a variant's keys are in the run config; the name is only in the point
    owen = [c for c in cells if c.point["variant"] == "fedowen"]
    assert len(cells) == 6 and owen[0].run_config["valuation"] == "owen"
    assert "variant" not in owen[0].run_config
    bad = ablation_preset()
    bad["variants"] = {**VARIANTS, "broken": {"valuation": "none", "aggregation": "softmax"}}
    bad["grid"][0]["axes"]["variant"] = ["fedavg-equal", "broken"]
    with pytest.raises(PresetError, match="weights by phi"):
        parse_preset(bad)
    with pytest.raises(PresetError, match="not defined in"):
        parse_preset(ablation_preset(axes={"seed": [0], "variant": ["nope"]}))
    with pytest.raises(PresetError, match="reference"):
        parse_preset(ablation_preset(reference="fedavg"))


def test_auto_axes_share_a_cell_with_their_explicit_values() -> None:
    # Prepare: the fedowen variant leaves selection and aggregation to auto; the second grid
    # writes what auto means today
    auto = app_config({"valuation": "owen"}).choices()
    raw = ablation_preset(kind="table", axes={"seed": [0], "variant": ["fedowen"]})
    raw["grid"].append({"name": "explicit", "rows": "valuation", "axes": {"seed": [0]},
                        "set": {"valuation": "owen", "selection": auto.selection,
                                "aggregation": auto.aggregation}})
    # Execute / Assert: one cell
    assert len(parse_preset(raw).cells()) == 1


def test_parallel_jobs_run_every_cell_once(tmp_path: Path) -> None:
    # Prepare: a fake run that records how many cells run at the same time
    fake, lock, live, peak = FakeFlwr([]), threading.Lock(), [0], [0]

    def slow_run(link: Any, cfg: dict[str, Any], **kw: Any) -> Any:
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        threading.Event().wait(0.2)
        with lock:
            live[0] -= 1
            return fake(link, cfg, **kw)

    runner = Runner(parse_preset(ablation_preset()), tmp_path / "res", tmp_path / "data",
                    run_fn=slow_run, link_factory=fake_link, progress=lambda m: None, jobs=3)
    # Execute
    counts = runner.run()
    # Assert
    assert counts["done"] == 6 and peak[0] == 3
    assert sorted(c["output-dir"] for c in fake.calls) == sorted(
        str((tmp_path / "res" / c.cell_id).resolve()) for c in runner.preset.cells())
    assert all(ev[-1]["event"] == "done" for ev in read_state(tmp_path / "res").values())


def test_ablation_report_pairs_seeds(tmp_path: Path) -> None:
    # Prepare: fedowen beats the reference by 2, 3 and 4 points on seeds 0-2
    preset = parse_preset(ablation_preset())
    finals = {"fedavg-equal": [0.80, 0.70, 0.60], "fedowen": [0.82, 0.73, 0.64]}
    for cell in preset.cells():
        acc = finals[cell.point["variant"]][cell.run_config["seed"]]
        weights = {"a": 0.7, "b": 0.3} if cell.point["variant"] == "fedowen" else {"a": 0.5,
                                                                                   "b": 0.5}
        # a FedOwen round: 2 s wall, 0.5 s valuation; an equal-weight one: 1 s, 0.1 s aggregating
        cost = ({"round_seconds": 2.0} if cell.point["variant"] == "fedowen" else
                {"round_seconds": 1.0, "valuation_seconds": None, "aggregation_seconds": 0.1})
        write_rounds(tmp_path / "res" / cell.cell_id, [0.1, 0.5, 0.6, acc],
                     {"weights": weights, "returned": ["a", "b"], **cost})
    # Execute
    write_report(preset, tmp_path / "res", tmp_path / "out")
    # Assert: differences 2, 3, 4: mean 3, sd 1 -> half-width 4.3027 / sqrt(3) = 2.48
    md = (tmp_path / "out" / "README.md").read_text()
    assert "| fedowen | **+3.00 ± 2.48** |" in md
    assert "| fedavg-equal | 70.00 ± 24.84 |" in md
    assert "| fedowen | 0.70 / 0.70 |" in md
    assert "| fedowen | 2.00 / 0.50 (2.00x) |" in md and "| fedavg-equal | 1.00 / 0.10 |" in md
    with open_csv(tmp_path / "out" / "abl-rounds.csv.gz") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 6 * 4
    last = [r for r in rows if r["variant"] == "fedowen" and r["seed"] == "2" and
            r["round"] == "3"]
    assert last[0]["test_accuracy"] == "64.0" and last[0]["max_weight"] == "0.7"
    assert (last[0]["round_seconds"], last[0]["server_seconds"]) == ("2.0", "0.5")
    assert (tmp_path / "out" / "abl-accuracy.png").stat().st_size > 10_000
    with (tmp_path / "out" / "abl-summary.csv").open() as fh:
        summary = {(r["variant"], r["metric"]): r for r in csv.DictReader(fh)}
    won = summary[("fedowen", "final")]
    assert (won["paired_n"], won["paired_diff"], won["paired_ci_half"]) == ("3", "3.0", "2.4841")
    assert won["paired_excludes_zero"] == "True" and won["values"] == "82.00 73.00 64.00"
    assert summary[("fedavg-equal", "final")]["paired_diff"] == ""
    assert "Close calls" not in md  # 73.0 vs 70.0: 3 points apart


def test_ablation_report_names_close_calls(tmp_path: Path) -> None:
    # Prepare: fedowen's mean final accuracy 1.5 points above the reference's, 3 seeds
    preset = parse_preset(ablation_preset())
    finals = {"fedavg-equal": [0.80, 0.70, 0.60], "fedowen": [0.83, 0.70, 0.615]}
    for cell in preset.cells():
        write_rounds(tmp_path / "res" / cell.cell_id,
                     [0.1, 0.5, 0.6, finals[cell.point["variant"]][cell.run_config["seed"]]],
                     {"weights": {"a": 1.0}, "returned": ["a"]})
    # Execute
    write_report(preset, tmp_path / "res", tmp_path / "out")
    # Assert
    md = (tmp_path / "out" / "README.md").read_text()
    assert ("- alpha=0.1: `fedowen` (3 seeds) best; `fedavg-equal` 1.50 points below (3 seeds) "
            "(more seeds wanted)") in md


def test_committed_ablation_presets_follow_the_protocol() -> None:
    # 100 rounds, >= 5 seeds, both alphas and schemes, paired against equal-weight FedAvg
    conf = Path(__file__).resolve().parents[1] / "conf"
    from sim.presets import load_preset

    preset = load_preset(conf / "ablation-mnist.toml")
    # the candidates share the ablation's equal-weight FedAvg and FedOwen cells
    # (the floor grid's cells are candidates too; the recipe grid's 28 are the ablation's at seed 0
    # with another recipe)
    assert len(preset.cells()) == 140 + 180 + 28 and preset.base["num-server-rounds"] == 100
    for grid in (g for g in preset.grids if g.name != "recipe"):  # recipe: a one-seed check
        assert len(grid.axes["seed"]) >= 5 and grid.axes["alpha"] == [0.01, 0.1]
        assert set(grid.axes["partition-scheme"]) == {"per-class", "per-client"}
        assert preset.variants[grid.reference]["aggregation"] == "uniform"


def test_a_changed_default_is_reported_not_hidden(tmp_path: Path) -> None:
    # Prepare: two finished cells; one recorded a tau other than the default this checkout
    # resolves (its preset does not name tau, so its id did not change with the default)
    from dataclasses import asdict

    from server_app.config import parse_run_config
    from sim.results import config_drift, drift_summary, sweep_drift

    preset = parse_preset(ablation_preset())
    stale, fresh = preset.cells()[:2]
    now = parse_run_config(stale.run_config).tau
    for cell, tau in ((stale, now + 1.0), (fresh, now)):
        recorded = asdict(parse_run_config(cell.run_config))
        recorded.update(tau=tau, output_dir=str(tmp_path / cell.cell_id))
        recorded.pop("weight_cap")  # a key added to the app after this run: not compared
        write_rounds(tmp_path / "res" / cell.cell_id, [0.1, 0.5, 0.6, 0.7])
        (tmp_path / "res" / cell.cell_id / "config.json").write_text(json.dumps(recorded))
    # Execute
    drift = sweep_drift(preset, tmp_path / "res")
    write_report(preset, tmp_path / "res", tmp_path / "out")
    # Assert: only tau of the stale cell, and the report says so
    assert drift == {stale.cell_id: {"tau": (now + 1.0, now)}}
    assert config_drift(fresh, {"tau": now, "output_dir": "elsewhere"}) == {}
    line = drift_summary(drift)
    assert line.startswith("1 cells ran with settings")
    assert f"tau {json.dumps(now + 1.0)} -> {json.dumps(now)} (1 cells)" in line
    assert line in (tmp_path / "out" / "README.md").read_text()


def test_auto_choices_are_compared_as_they_resolve_not_as_written() -> None:
    # Prepare: a preset whose cells ran when auto meant Algorithm 2; an owen cell that
    # recorded selection "auto" and the identity cap's old default 0
    from dataclasses import asdict

    from server_app.config import parse_run_config
    from sim.results import config_drift

    raw = ablation_preset()
    raw["preset"]["auto-selection"] = "adaptive"
    cell = next(c for c in parse_preset(raw).cells() if c.point["variant"] == "fedowen")
    recorded = {**asdict(parse_run_config(cell.run_config)), "selection": "auto",
                "selection_cap": 0.0}
    # Execute / Assert: auto pinned as the preset says, cap -1 resolved to adaptive's 0
    assert cell.run_config["selection"] == "adaptive"
    assert config_drift(cell, recorded, "adaptive") == {}
    # a run that did use another selector or cap is still named
    assert config_drift(cell, {**recorded, "selection": "random"}, "adaptive") == {
        "selection": ("random", "adaptive")}
    assert config_drift(cell, {**recorded, "selection_cap": 3.0}, "adaptive") == {
        "selection_cap": (3.0, 0.0)}


def test_rounds_with_non_finite_weights_have_no_largest_weight() -> None:
    # FLTrust's weights are recorded as null once its server update diverged to NaN
    from sim.results import CellResult
    from studies.ablation.data import max_weights

    cell = parse_preset(ablation_preset()).cells()[0]
    rounds = [{"round": 0}, {"round": 1, "weights": {"a": 0.25, "b": 0.75}},
              {"round": 2, "weights": {"a": None, "b": None}}, {"round": 3, "weights": {}}]
    assert max_weights(CellResult(cell, rounds)) == [(1, 0.75)]
