"""The replay of archived cells (studies.selection.replay): which cells it takes, the run config
it replays, and its round-by-round comparison, on hand-built rounds; and, in the slow suite,
the first rounds of one real ``hics-phi`` cell of selection-peers-dev replayed at this checkout
against its archive (issue 73).

The slow test replays FEMNIST's writers, seed 0 (cell 0b34f10b0036, archived at the grid's pin
c214fce) for its 10 warm-up rounds (its 100 clients, 10 a round: every client's first round)
and asks for what another CPU's kernels cannot move: the same selections in every round, and
in rounds 1-3, before SGD has grown the kernels' last bits (docs/results/selection-peers-dev/
replay-hics-phi.md: 1e-8 in the weights there, 1e-3 by round 10), the same aggregation weights
and phi to 1e-5 and the same validation and test accuracy to 1e-3. About a minute of one core
(10 FEMNIST rounds, data loading included): too slow for the fast suite.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sim.grid import Cell
from sim.presets import load_preset
from studies.selection.replay import (
    REPO,
    Archived,
    compare,
    largest_gap,
    manifest_path,
    pick_cells,
    read_archived,
    replay,
    replay_config,
)

PRESET = REPO / "conf" / "selection-peers-dev.toml"


def hics_cell(**keys: object) -> Cell:
    return Cell("abc", "g", {"selection": "hics-phi", "valuation": "owen", **keys}, {})


def test_the_largest_gap_counts_a_client_missing_on_one_side_whole() -> None:
    # Prepare: a: 0.1 vs 0.15 (0.05); b only in the first (0.2); c only in the second (0.05)
    first, second = {"a": 0.1, "b": 0.2}, {"a": 0.15, "c": 0.05}
    # Execute / Assert
    assert largest_gap(first, second) == pytest.approx(0.2)
    assert largest_gap({"a": 0.1}, {"a": 0.1}) == 0.0
    assert math.isnan(largest_gap(None, {"a": 0.1}))


def test_hics_rounds_left_to_the_run_length_is_pinned_to_the_archived_run() -> None:
    # Prepare: a cell that leaves hics-rounds at 0 (the run's 100 rounds) and one that sets it
    left = Archived(hics_cell(), {"hics_rounds": 0, "num_server_rounds": 100}, [], [])
    resolved = Archived(hics_cell(), {"hics_rounds": 100, "num_server_rounds": 100}, [], [])
    pinned = Archived(hics_cell(**{"hics-rounds": 50}), {"hics_rounds": 50}, [], [])
    # Execute
    configs = [replay_config(a, 20, Path("/tmp/x")) for a in (left, resolved, pinned)]
    # Assert: 20 rounds into /tmp/x; the annealing over the archived run's 100 (or its own 50)
    assert [c["num-server-rounds"] for c in configs] == [20, 20, 20]
    assert [c["output-dir"] for c in configs] == ["/tmp/x"] * 3
    assert [c["hics-rounds"] for c in configs] == [100, 100, 50]


def test_compare_reads_each_round_of_both_runs() -> None:
    # Prepare: round 1 alike but for a weight (0.6 vs 0.5) and val (0.50 vs 0.52); round 2
    # selects another client
    old = [{"round": 0, "val_accuracy": 0.1, "test_accuracy": 0.1},
           {"round": 1, "selected": ["1", "2"], "weights": {"1": 0.6, "2": 0.4},
            "phi": {"1": 1.0, "2": 0.5}, "val_accuracy": 0.50, "test_accuracy": 0.40},
           {"round": 2, "selected": ["1", "3"], "weights": {"1": 0.5, "3": 0.5},
            "phi": {"1": 1.0, "3": 0.0}, "val_accuracy": 0.60, "test_accuracy": 0.55}]
    new = [dict(old[0]), {**old[1], "weights": {"1": 0.5, "2": 0.4}, "val_accuracy": 0.52},
           {**old[2], "selected": ["1", "4"], "weights": {"1": 0.5, "4": 0.5},
            "phi": {"1": 1.0, "4": 0.25}}]
    # Execute
    rows = compare("s", "abc", old, new, 2)
    # Assert: weights 0.1 apart in round 1; in round 2 client 3's 0.5 and 4's 0.5 (each missing
    # on one side), phi 0.25 (client 4)
    assert [r["round"] for r in rows] == [1, 2]
    assert [r["selected_equal"] for r in rows] == [True, False]
    assert [r["weights_max_diff"] for r in rows] == pytest.approx([0.1, 0.5])
    assert [r["phi_max_diff"] for r in rows] == pytest.approx([0.0, 0.25])
    assert (rows[0]["val_archived"], rows[0]["val_replay"]) == (0.50, 0.52)
    assert [r["pin_equal"] for r in rows] == ["", ""]
    with pytest.raises(SystemExit, match="round 3 missing from the archive"):
        compare("s", "abc", old, new, 3)


def test_the_run_at_the_pin_equals_the_replay_but_for_times_and_costs() -> None:
    # Prepare: the pin's round 1 differs in its times and its selection costs only; its round 2
    # in a weight
    new = [{"round": 1, "selected": ["1"], "weights": {"1": 1.0}, "val_accuracy": 0.5,
            "test_accuracy": 0.5, "round_seconds": 2.0,
            "selection": {"how": "hics-phi", "selector_seconds": 0.1, "extra_messages": 0}},
           {"round": 2, "selected": ["2"], "weights": {"2": 1.0}, "val_accuracy": 0.6,
            "test_accuracy": 0.6}]
    pin = [{**new[0], "round_seconds": 3.0, "selection": {"how": "hics-phi",
                                                          "server_seconds": 0.2}},
           {**new[1], "weights": {"2": 0.9}}]
    # Execute
    rows = compare("s", "abc", new, new, 2, pin)
    # Assert
    assert [r["pin_equal"] for r in rows] == [True, False]


def test_one_cell_per_setting_seed_zero_where_archived() -> None:
    # Prepare
    preset = load_preset(PRESET)
    manifest = json.loads(manifest_path(preset).read_text())
    # Execute
    picked = pick_cells(preset, manifest, "hics-phi", 0)
    fallback = pick_cells(preset, manifest, "hics-phi", 9)
    # Assert: the six settings' seed-0 cells (the manifest's ids), with their parts; a seed not
    # archived falls back to the lowest (0)
    assert [(c.cell_id, part) for c, part in picked] == [
        ("0b34f10b0036", 1), ("434a1b308c55", 1), ("5f4830c2bcf5", 2), ("e07f86287fa7", 2),
        ("19acad4d5025", 3), ("752b64ffb7fc", 3)]
    assert [c.cell_id for c, _ in fallback] == [c.cell_id for c, _ in picked]
    with pytest.raises(SystemExit, match="no archived cell of variant 'nope'"):
        pick_cells(preset, manifest, "nope", 0)


@pytest.mark.slow
def test_the_first_rounds_of_an_archived_hics_phi_cell_replay_at_this_checkout(
        tmp_path: Path, shared_data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: FEMNIST's writers, seed 0, as archived (module docstring)
    monkeypatch.setenv("FEDOWEN_DATA", str(shared_data_dir))
    preset = load_preset(PRESET)
    cell, part = pick_cells(preset, json.loads(manifest_path(preset).read_text()),
                            "hics-phi", 0)[0]
    archived = read_archived(cell, REPO / "archives" / preset.name / f"cells-part{part:02d}.tar.xz")
    # Execute
    rows = compare("femnist", cell.cell_id, archived.rounds,
                   replay(archived, 10, tmp_path, 1800, preset.num_supernodes), 10)
    # Assert
    assert cell.cell_id == "0b34f10b0036"
    assert all(r["selected_equal"] for r in rows)
    for r in rows[:3]:
        assert r["weights_max_diff"] < 1e-5 and r["phi_max_diff"] < 1e-5, r
        assert abs(r["val_replay"] - r["val_archived"]) < 1e-3, r
        assert abs(r["test_replay"] - r["test_archived"]) < 1e-3, r
