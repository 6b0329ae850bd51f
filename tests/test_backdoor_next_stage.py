"""The presets after backdoor-defaults-dev's reading (studies.backdoor.next_stage): stage 2 at
10% attackers with the defaults pinned, and the fresh seeds, which refuse used seeds and
defaults that are not the pick's."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import tomli_w

from fedowen_strategy.defences.table import FEDOWEN_DEFENCES
from server_app.keys import defaults
from sim.presets import load_preset
from studies.backdoor.next_stage import (
    NO_PICK,
    adoption_gaps,
    fresh,
    fresh_defaults,
    load,
    main,
    stage2,
    used_seeds,
    variant,
)

STAGE1 = Path("conf/backdoor-defaults-dev.toml")
#: The fresh preset stage 1's reading wrote (no pick: the defaults on seeds 70-72), whose seeds
#: the fresh() tests reuse: read without it, as main() reads conf/ without its --out.
FRESH = Path("conf/backdoor-defaults-fresh.toml")
PICK = "alignins-2+spread-2"


@pytest.fixture(scope="module")
def stage2_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("next") / "stage2.toml"
    assert main(["stage2", str(STAGE1), "--arm", PICK, "--out", str(out)]) == 0
    return out


def test_stage_2_is_stage_1s_attacks_at_10_percent_for_the_pick_and_the_pinned_defaults(
        stage2_file: Path) -> None:
    # Execute
    cells = load_preset(stage2_file).cells()
    first = load_preset(STAGE1).cells()
    # Assert: 5 settings x 5 attacks x seeds 0-2 x 2 arms, no clean cell
    assert len(cells) == 150
    assert Counter(str(c.point["variant"]) for c in cells) == {"fedowen": 75, PICK: 75}
    assert {c.config.adversary_fraction for c in cells} == {0.1}
    assert {c.run_config["krum-malicious"] for c in cells} == {1}
    assert {c.config.seed for c in cells} == {0, 1, 2}
    attacked = {(c.grid, c.config.dataset, c.config.alpha) for c in first
                if c.config.adversary_fraction > 0}
    assert {(c.grid, c.config.dataset, c.config.alpha) for c in cells} == attacked
    # fedowen's "auto" is pinned to the list it means today; the pick's keys are stage 1's
    ref = next(c for c in cells if c.point["variant"] == "fedowen")
    assert ref.run_config["defences"] == " ".join(FEDOWEN_DEFENCES)
    picked = next(c for c in cells if c.point["variant"] == PICK)
    assert picked.run_config["aggregation"] == "softmax-spread"
    assert "written by python -m studies.backdoor.next_stage" in stage2_file.read_text()
    assert "--out DIR --stage-1 held" in stage2_file.read_text()  # how to read it


def test_stage_2_of_a_fallback_pick_says_how_it_is_read(tmp_path: Path) -> None:
    out = tmp_path / "stage2.toml"
    assert main(["stage2", str(STAGE1), "--arm", PICK, "--out", str(out),
                 "--stage-1", "fallback"]) == 0
    assert "--out DIR --stage-1 fallback" in out.read_text()


def test_stage_2_refuses_the_reference_and_an_unknown_arm() -> None:
    raw = load(STAGE1)
    with pytest.raises(SystemExit, match="is the reference"):
        stage2(raw, "fedowen")
    with pytest.raises(SystemExit, match=r"'alignins-3' is not a variant.*alignins-2"):
        stage2(raw, "alignins-3")


def test_the_defaults_have_no_gap_to_stage_1s_reference_and_name_each_gap_to_a_pick() -> None:
    raw = load(STAGE1)
    assert adoption_gaps(variant(raw, "fedowen", STAGE1)) == []
    gaps = adoption_gaps(variant(raw, PICK, STAGE1))
    assert [g.split(":")[0] for g in gaps] == ["aggregation", "temperature", "defences",
                                               "alignins-lambda-s", "alignins-lambda-c"]
    assert "the pick has 'softmax-spread', the app's default is 'softmax'" in gaps[0]


def adopted_app() -> dict[str, object]:
    """The app's defaults as they would read once PICK is adopted."""
    keys = variant(load(STAGE1), PICK, STAGE1)
    return {**defaults(), **{k: keys[k] for k in ("aggregation", "temperature",
                                                  "alignins-lambda-s", "alignins-lambda-c")},
            "defences": "identity norm-ratio update-bound update-filter alignins norm-cap "
                        "statistics-cap value-cap links statistics-rule robust-lr "
                        "aggregate-noise"}


def test_fresh_seeds_run_the_app_defaults_beside_the_pinned_reference(
        stage2_file: Path, tmp_path: Path) -> None:
    # Prepare
    raw, raw2 = load(STAGE1), load(stage2_file)
    # Execute
    made = fresh(raw, raw2, PICK, [70, 71, 72], [70, 71, 72, 73, 74], used_seeds(Path("conf"),
                 skip=FRESH), app=adopted_app())
    out = tmp_path / "fresh.toml"
    out.write_text(tomli_w.dumps(made))
    cells = load_preset(out).cells()
    # Assert: attacked at stage 1's 20% on 70-72, clean on 70-74, and the adaptive attack again
    # knowing the defence list; adopted pins no key
    assert len(cells) == 2 * (75 + 25 + 15)
    knows = [c for c in cells if c.grid.startswith("adaptive-knows-")]
    assert len(knows) == 30 and {c.run_config["adversary-knows"] for c in knows} == {"defences"}
    assert {c.run_config.get("adversary-knows", "bounds") for c in cells if c not in knows} == {
        "bounds"}
    assert {c.config.seed for c in cells if c.config.adversary_fraction == 0.2} == {70, 71, 72}
    assert {c.config.seed for c in cells if c.config.adversary_fraction == 0} == set(range(70, 75))
    assert made["variants"]["adopted"] == {}
    assert made["variants"]["fedowen"]["defences"] == " ".join(FEDOWEN_DEFENCES)
    assert made["preset"]["name"] == "backdoor-defaults-fresh"


def test_fresh_refuses_used_seeds_and_defaults_not_yet_adopted(stage2_file: Path) -> None:
    raw, raw2 = load(STAGE1), load(stage2_file)
    used = used_seeds(Path("conf"), skip=FRESH)
    assert {0, 1, 2, 3, 4, 60, 61, 62} <= used
    with pytest.raises(SystemExit, match=r"seeds \[60\] are named"):
        fresh(raw, raw2, PICK, [60, 71, 72], [70, 71], used, app=adopted_app())
    with pytest.raises(SystemExit, match=r"not 'alignins-2\+spread-2' yet.*\n  aggregation"):
        fresh(raw, raw2, PICK, [70, 71, 72], [70, 71], used)
    with pytest.raises(SystemExit, match="leaves defences at auto"):
        fresh(raw, raw, PICK, [70, 71, 72], [70, 71], used, app=adopted_app())


def test_no_pick_writes_the_fresh_seeds_for_the_defaults_alone(tmp_path: Path) -> None:
    # Prepare: stage 1 picked none (its decision.md), so there is no stage 2
    out = tmp_path / "fresh.toml"
    # Execute
    code = main(["fresh", str(STAGE1), "--arm", NO_PICK, "--seeds", "80", "81", "82",
                 "--clean-seeds", "80", "81", "82", "--out", str(out)])
    cells = load_preset(out).cells()
    # Assert: one arm, no key pinned; stage 1's attacks and the knowing adaptive one on 80-82
    assert code == 0 and {str(c.point["variant"]) for c in cells} == {"adopted"}
    assert len(cells) == 75 + 15 + 15 and load(out)["variants"] == {"adopted": {}}
    assert {c.config.seed for c in cells} == {80, 81, 82}
    assert sum(c.grid.startswith("adaptive-knows-") for c in cells) == 15
    with pytest.raises(SystemExit, match=r"seeds \[0, 70\] are named"):  # 70: the committed
        main(["fresh", str(STAGE1), "--arm", NO_PICK, "--seeds", "0", "--clean-seeds", "70",
              "--out", str(out)])
    moved = {**defaults(), "aggregation": "softmax-spread"}
    with pytest.raises(SystemExit, match=r"no longer stage 1's 'fedowen'.*\n  aggregation"):
        fresh_defaults(load(STAGE1), [70], [70], set(), app=moved)
