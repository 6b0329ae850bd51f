"""The selection development grid's rule (studies.selection.development) on hand-built scores."""

from __future__ import annotations

from typing import Any

import pytest

from studies.selection.development import CONTENDERS, VAL, Setting, verdict


def setting(name: str, means: dict[str, float], spread: float = 0.5) -> Setting:
    """Five seeds per arm: ``mean + spread * (-2, -1, 0, 1, 2)`` (the same pattern for every
    arm, so paired differences are exact)."""
    scores = {arm: {VAL: {s: m + spread * (s - 2) for s in range(5)}}
              for arm, m in means.items()}
    return Setting(name, scores, {arm: dict.fromkeys(range(5), 0.5) for arm in means})


def test_the_rule_tunes_peers_and_adopts_the_best_eligible_contender() -> None:
    # Prepare: posterior-rank best on average but below the best peer in one setting;
    # posterior-phi never below anyone; Algorithm 2 below random in one
    base = {"poc-d20": 80.0, "poc-d50": 82.0, "oort-x0.3": 79.0, "oort-x0.1": 78.0,
            "fedowen-random": 80.0}
    one = setting("a", {**base, "fedowen": 90.0, "posterior-rank": 95.0,
                        "posterior-phi": 83.0})
    two = setting("b", {**base, "fedowen": 75.0, "posterior-rank": 81.0,
                        "posterior-phi": 82.5})
    # Execute
    adopted, failures = verdict([one, two], {"posterior-phi": []})
    # Assert: d = 50 and floor 0.3 tuned; poc-d50 the best peer; hand-read failures
    assert one.tuned("power-of-choice") == "poc-d50" and one.tuned("oort") == "oort-x0.3"
    assert one.best_peer() == "poc-d50"
    assert failures["posterior-rank"] == ["b: -1.00 ± 0.00 vs poc-d50"]
    assert len(failures["fedowen"]) == 2  # below random and below the best peer in b
    assert failures["posterior-phi"] == [] and failures["fedowen-random"] == [
        "a: -2.00 ± 0.00 vs poc-d50", "b: -2.00 ± 0.00 vs poc-d50"]
    assert adopted == "posterior-phi"
    # a collapsed attacked run makes a contender ineligible
    adopted, failures = verdict([one, two], {"posterior-phi": ["attacks seed=0 boosted"]})
    assert failures["posterior-phi"] == ["attacks seed=0 boosted collapsed"]
    assert adopted in CONTENDERS and adopted != "posterior-phi"


def test_a_setting_is_read_from_the_device_only_when_all_its_cells_finished_there() -> None:
    from pathlib import Path

    from sim.presets import load_preset
    from sim.results import CellResult
    from studies.selection.development import merge_machines, setting_key

    # Prepare: the real grid; the CPU has every cell, the device every MNIST alpha 0.01 cell
    # (clean) and all but one MNIST alpha 0.1 cell
    preset = load_preset(Path("conf/selection-dev.toml"))
    cells = preset.cells()

    def done(cell: Any) -> CellResult:
        return CellResult(cell, [{"round": r} for r in range(101)])

    cpu = {c.cell_id: done(c) for c in cells}
    on_device = [c for c in cells if setting_key(c) in ("mnist alpha=0.01", "mnist alpha=0.1")]
    device = {c.cell_id: CellResult(c, []) for c in cells}
    device.update({c.cell_id: done(c) for c in on_device[:-1]})
    missing = on_device[-1]
    # Execute
    merged, machine = merge_machines(preset, cpu, device)
    # Assert: eight settings; only the whole one comes from the device
    assert len(machine) == 8 and setting_key(missing) != "mnist alpha=0.01"
    assert [k for k, v in machine.items() if v == "device"] == ["mnist alpha=0.01"]
    for c in cells:
        source = device if setting_key(c) == "mnist alpha=0.01" else cpu
        assert merged[c.cell_id] is source[c.cell_id]
    assert merge_machines(preset, cpu, None)[1] == dict.fromkeys(machine, "CPU")


def test_top_share_is_the_most_selected_clients_count_over_a_uniform_draws() -> None:
    from sim.results import CellResult
    from studies.selection.development import distinct_share, top_share

    # Prepare: 4 clients, 3 rounds of 2; client 0 every round (3 of 6 selections)
    rounds = [{"round": 0}, {"round": 1, "selected": [0, 1]}, {"round": 2, "selected": [0, 2]},
              {"round": 3, "selected": [0, 3]}]
    result = CellResult(None, rounds)  # type: ignore[arg-type]
    # Execute, Assert: uniform would give each 6 / 4 = 1.5; client 0 has 3, twice that
    assert top_share(result, 4) == 2.0
    assert distinct_share(result, 4) == 1.0 and distinct_share(result, 8) == 0.5


def test_when_none_is_eligible_the_fewest_failures_then_the_higher_mean_is_adopted() -> None:
    # Prepare: in setting b every contender is below random selection and the best peer (two
    # failures each; random itself is below the best peer in both settings); in a, Algorithm 2
    # leads posterior-phi by 0.1, so their means differ by 0.05
    from studies.selection.development import mean_vals

    base = {"poc-d20": 80.5, "poc-d50": 80.0, "oort-x0.3": 79.0, "oort-x0.1": 78.0,
            "fedowen-random": 79.5}
    one = setting("a", {**base, "fedowen": 90.1, "posterior-rank": 85.0,
                        "posterior-phi": 90.0})
    two = setting("b", {**base, "fedowen-random": 80.0, "fedowen": 79.0,
                        "posterior-rank": 79.0, "posterior-phi": 79.0})
    # Execute
    adopted, failures = verdict([one, two], {})
    means = mean_vals([one, two])
    # Assert: equal failures, so the higher mean wins
    assert {a: len(f) for a, f in failures.items()} == dict.fromkeys(CONTENDERS, 2)
    assert means["fedowen"] - means["posterior-phi"] == pytest.approx(0.05)
    assert adopted == "fedowen"
    # one more failure for Algorithm 2 (a third setting where only it is below random) and
    # the fewer failures win over the higher mean
    three = setting("c", {**base, "fedowen": 79.0, "posterior-rank": 79.6,
                          "posterior-phi": 79.6})
    adopted, failures = verdict([one, two, three], {})
    assert len(failures["fedowen"]) == 4 and len(failures["posterior-phi"]) == 3
    assert mean_vals([one, two, three])["fedowen"] > mean_vals([one, two, three])["posterior-rank"]
    assert adopted == "posterior-phi"
