"""Ablation presets: variants, parallel inline cells (runner faked), paired-CI report."""

from __future__ import annotations

import csv
import json
import math
import threading
from pathlib import Path
from typing import Any

import pytest

from sim.compact import open_csv
from sim.grid import app_config
from sim.presets import PresetError, parse_preset
from sim.report import write_report
from sim.runner import Runner, read_state
from sim.stats import mean_interval, paired_interval
from tests.fake_runner import FakeFlwr, fake_link, write_rounds

VARIANTS = {"fedavg-equal": {"valuation": "none", "aggregation": "uniform"},
            "fedowen": {"valuation": "owen"}}


def ablation_preset(**grid_extra: Any) -> dict[str, Any]:
    grid = {"name": "abl", "kind": "ablation", "reference": "fedavg-equal", "rows": "variant",
            "axes": {"seed": [0, 1, 2], "alpha": [0.1], "variant": list(VARIANTS)},
            **grid_extra}
    return {"preset": {"name": "abl", "num-supernodes": 10, "backend": "inline"},
            "base": {"dataset": "mnist", "num-server-rounds": 3},
            "variants": VARIANTS, "grid": [grid]}


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
    from sim.ablation_data import max_weights
    from sim.results import CellResult

    cell = parse_preset(ablation_preset()).cells()[0]
    rounds = [{"round": 0}, {"round": 1, "weights": {"a": 0.25, "b": 0.75}},
              {"round": 2, "weights": {"a": None, "b": None}}, {"round": 3, "weights": {}}]
    assert max_weights(CellResult(cell, rounds)) == [(1, 0.75)]


def test_overview_puts_every_grid_of_a_split_value_in_one_table(tmp_path: Path) -> None:
    # Prepare: a clean grid and an attacked one (two kinds), both over alpha; fedowen wins
    # only under noise, by 5 points; every round takes fedowen twice the reference's time
    raw = ablation_preset(axes={"seed": [0, 1], "alpha": [0.1, 0.01],
                                "variant": list(VARIANTS)})
    raw["grid"].append({**raw["grid"][0], "name": "attacked",
                        "set": {"adversary-fraction": 0.2},
                        "axes": {"seed": [0, 1], "adversary-kind": ["noise", "free-rider"],
                                 "alpha": [0.1, 0.01], "variant": list(VARIANTS)},
                        # a third seed for one entry: its count is named
                        "extra": [{"seed": [2], "adversary-kind": ["noise"], "alpha": [0.1],
                                   "variant": ["fedowen"]}]})
    preset = parse_preset(raw)
    for cell in preset.cells():
        cfg, ours = cell.run_config, cell.point["variant"] == "fedowen"
        acc = 0.80 + (0.05 if ours and cfg.get("adversary-kind") == "noise" else
                      -0.01 if ours else 0.0) + 0.01 * cfg["seed"]
        write_rounds(tmp_path / "res" / cell.cell_id, [0.1, 0.5, 0.6, acc],
                     {"weights": {"a": 1.0}, "returned": ["a"],
                      "round_seconds": 2.0 if ours else 1.0})
    # Execute
    write_report(preset, tmp_path / "res", tmp_path / "out")
    # Assert: one table per alpha, the clean grid and both attacks as columns, best in bold
    md = (tmp_path / "out" / "README.md").read_text()
    overview = md.split("## Overview")[1].split("## abl")[0]
    assert overview.count("| variant | abl | attacked, noise | attacked, free-rider |") == 2
    assert "alpha = 0.1:" in overview and "alpha = 0.01:" in overview
    assert overview.count("| fedowen | 79.50 ± 6.35 | **85.50 ± 6.35** | 79.50 ± 6.35 |") == 1
    assert "| fedowen | 79.50 ± 6.35 | **86.00 ± 2.48 (n=3)** | 79.50 ± 6.35 |" in overview
    assert overview.count("| fedavg-equal | **80.50 ± 6.35** | 80.50 ± 6.35 | "
                          "**80.50 ± 6.35** |") == 2
    assert "fedowen 2.00x" in overview


def test_extra_seeds_for_a_close_call_join_the_same_table(tmp_path: Path) -> None:
    # Prepare: a close call (1.5 points) given two more seeds for both rows, as extra points
    raw = ablation_preset(extra=[{"seed": [3, 4]}])
    preset = parse_preset(raw)
    finals = {"fedavg-equal": [0.80, 0.70, 0.60, 0.70, 0.70],
              "fedowen": [0.83, 0.70, 0.615, 0.72, 0.73]}
    for cell in preset.cells():
        write_rounds(tmp_path / "res" / cell.cell_id,
                     [0.1, 0.5, 0.6, finals[cell.point["variant"]][cell.run_config["seed"]]],
                     {"weights": {"a": 1.0}, "returned": ["a"]})
    # Execute
    write_report(preset, tmp_path / "res", tmp_path / "out")
    # Assert: 10 cells, the 5-seed paired difference (mean 1.9) and no call for more seeds
    assert len(preset.cells()) == 10
    assert [c.run_config["seed"] for c in preset.cells()][-4:] == [3, 3, 4, 4]
    md = (tmp_path / "out" / "README.md").read_text()
    assert ("- alpha=0.1: `fedowen` (5 seeds) best; `fedavg-equal` 1.90 points below (5 seeds)"
            in md) and "more seeds wanted" not in md
    rows = list(csv.DictReader((tmp_path / "out" / "abl-summary.csv").open()))
    owen = next(r for r in rows if r["variant"] == "fedowen" and r["metric"] == "final")
    assert owen["n"] == "5" and owen["paired_n"] == "5"


def test_extra_points_on_one_row_are_counted_per_row(tmp_path: Path) -> None:
    # Prepare: only fedowen gets seeds 3 and 4, so the reference row stays at 3 of 3
    preset = parse_preset(ablation_preset(extra=[{"seed": [3, 4], "variant": ["fedowen"]}]))
    for cell in preset.cells():
        write_rounds(tmp_path / "res" / cell.cell_id, [0.1, 0.5, 0.6, 0.7],
                     {"weights": {"a": 1.0}, "returned": ["a"]})
    (tmp_path / "res" / preset.cells()[-1].cell_id / "rounds.jsonl").unlink()
    # Execute
    write_report(preset, tmp_path / "res", tmp_path / "out")
    # Assert: fedowen's entry says 4 of its 5 planned seeds; fedavg-equal's no count at all
    md = (tmp_path / "out" / "README.md").read_text()
    table = md[md.index("| variant |"):].splitlines()
    assert "(n=4/5)" in next(r for r in table if r.startswith("| fedowen |"))
    assert "(n=" not in next(r for r in table if r.startswith("| fedavg-equal |"))


@pytest.mark.parametrize(("extra", "match"), [
    ([{"lr": [0.1]}], "not one of the axes"),
    ([{"alpha": [0.5]}], "only seeds may be new"),
    ([{"seed": []}], "non-empty list"),
    ({"seed": [3]}, "list of tables"),
])
def test_extra_points_are_validated(extra: Any, match: str) -> None:
    with pytest.raises(PresetError, match=match):
        parse_preset(ablation_preset(extra=extra))


def test_an_override_changes_only_the_points_it_names_and_survives_the_stored_preset() -> None:
    # Prepare: fedowen tuned per alpha: budget 8 at alpha 0.01 only
    raw = ablation_preset(overrides=[{"where": {"alpha": 0.01, "variant": "fedowen"},
                                      "set": {"budget-m": 8}}])
    raw["grid"][0]["axes"]["alpha"] = [0.1, 0.01]
    plain = ablation_preset()
    plain["grid"][0]["axes"]["alpha"] = [0.1, 0.01]
    # Execute
    preset = parse_preset(raw)
    cells = {(c.point["variant"], c.point["alpha"], c.run_config["seed"]): c
             for c in preset.cells()}
    # Assert: the one arm x setting has the key, every other cell is the plain preset's cell
    assert {k for k, c in cells.items() if c.run_config.get("budget-m") == 8} == {
        ("fedowen", 0.01, s) for s in (0, 1, 2)}
    others = {c.cell_id for k, c in cells.items() if k[:2] != ("fedowen", 0.01)}
    assert others <= {c.cell_id for c in parse_preset(plain).cells()}
    assert len(cells) == 12 and preset.grids[0].column_keys == ["alpha"]
    # the results folder's preset.json reads back to the same cells
    again = parse_preset(json.loads(json.dumps(preset.to_json())))
    assert [c.cell_id for c in again.cells()] == [c.cell_id for c in preset.cells()]


@pytest.mark.parametrize(("overrides", "match"), [
    ([{"where": {"alpha": 0.5}, "set": {"budget-m": 8}}], "not an axis value"),
    ([{"where": {"lr": 0.1}, "set": {"budget-m": 8}}], "not an axis value"),
    ([{"where": {"alpha": 0.1}, "set": {}}], "both non-empty"),
    ([{"where": {"alpha": 0.1}, "set": {"budget-m": 8}, "to": 1}], "unknown key 'to'"),
    ([{"where": {"alpha": 0.1}, "set": {"no-such-key": 1}}], "no-such-key"),
    ({"where": {"alpha": 0.1}}, "list of tables"),
])
def test_overrides_are_validated(overrides: Any, match: str) -> None:
    with pytest.raises(PresetError, match=match):
        parse_preset(ablation_preset(overrides=overrides))


def test_committed_arena_preset_follows_the_protocol() -> None:
    # issue 17: 7 defences x 7 attacks x both alphas, 100 rounds, >= 3 seeds per cell, paired
    # against FLTrust; a close call's extra seeds add cells to the same grids
    from sim.presets import load_preset

    preset = load_preset(Path(__file__).resolve().parents[1] / "conf" / "arena-mnist.toml")
    assert preset.base["num-server-rounds"] == 100
    ablations = [g for g in preset.grids if g.kind == "ablation"]
    assert {g.reference for g in ablations} == {"fltrust"}
    points = {(c.point["variant"], c.run_config.get("adversary-kind", "none"),
               c.run_config["alpha"]) for c in preset.cells()}
    assert len(points) == 7 * 7 * 2
    for point in points:
        seeds = {c.run_config["seed"] for c in preset.cells()
                 if (c.point["variant"], c.run_config.get("adversary-kind", "none"),
                     c.run_config["alpha"]) == point}
        assert seeds in ({0, 1, 2}, {0, 1, 2, 3, 4}), point
