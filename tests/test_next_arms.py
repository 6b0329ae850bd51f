"""The next confirmation's selector arms (studies.selection.next_arms) from hand-built
decisions: each arm's keys as the preset that ran it declares them; nothing before a default is
adopted."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from sim.presets import load_preset
from studies.selection.next_arms import arms, toml_text


def decisions(adopted: str | None, best: str = "poc-d50") -> dict[str, object]:
    tuned = {"greedyfed": "greedyfed-m0.9", "delta": "delta-s0", "hics-fl": "hics-t0.1"}
    return {"settings_read": ["mnist alpha=0.01"], "settings_total": 1, "adopted": adopted,
            "settings": {"mnist alpha=0.01": {"tuned": tuned, "best_peer": best}}}


def test_each_arm_carries_the_keys_of_the_preset_that_ran_it() -> None:
    # Prepare: Power-of-Choice d50 the best peer of the papers' readings, hics-code's 0.1 of
    # either; hics-phi adopted
    code = {"settings_read": ["mnist alpha=0.01"], "settings_total": 1,
            "settings": {"mnist alpha=0.01": {"best_peer": "hics-code-t0.1"}}}
    # Execute
    papers = arms(decisions("hics-phi"))
    either = arms(decisions("hics-phi"), code)
    text = toml_text(either)
    # Assert
    assert papers["mnist alpha=0.01"] == {
        "greedyfed": "greedyfed-m0.9", "delta": "delta-s0", "hics-fl": "hics-t0.1",
        "better-selector": "poc-d50", "default": "hics-phi"}
    assert either["mnist alpha=0.01"]["better-selector"] == "hics-code-t0.1"
    parsed = tomllib.loads(text)["settings"]["mnist alpha=0.01"]
    peers = load_preset(Path("conf/selection-peers-dev.toml")).variants
    code_preset = load_preset(Path("conf/selection-peers-code.toml")).variants
    assert parsed["delta"] == {"variant": "delta-s0", "keys": peers["delta-s0"]}
    assert parsed["default"]["keys"] == peers["hics-phi"]
    assert parsed["better-selector"]["keys"] == code_preset["hics-code-t0.1"]
    assert parsed["better-selector"]["keys"]["hics-switch"] == 0.1


def test_today_s_default_comes_from_selection_dev() -> None:
    parsed = tomllib.loads(toml_text(arms(decisions("fedowen"))))["settings"]
    keys = parsed["mnist alpha=0.01"]["default"]["keys"]
    assert keys == load_preset(Path("conf/selection-dev.toml")).variants["fedowen"]
    assert keys["selection"] == "adaptive"
    assert parsed["mnist alpha=0.01"]["better-selector"]["keys"]["poc-d"] == 50


def test_nothing_is_written_before_the_default_is_adopted() -> None:
    with pytest.raises(SystemExit, match="adopted no default yet"):
        arms(decisions(None))
    partial = {"settings_read": [], "settings_total": 6, "settings": {}}
    with pytest.raises(SystemExit, match="read 0 of 6 settings"):
        arms(decisions("fedowen"), partial)
