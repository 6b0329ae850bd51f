"""What ``selection = "auto"`` runs: Algorithm 2, selection-dev's ``fedowen`` arm (the incumbent
that selection-peers-dev's ``hics-phi`` only tied, issue 73), read from the preset so that a
drift of either the arm or the app's defaults fails here; FedAvg's uniform selection for a
method that computes no phi. ``hics-phi`` stays a selectable candidate."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from fedowen_strategy.round.contribution import resolve_auto
from fedowen_strategy.selectors import registry
from server_app.config import RunConfig, parse_run_config
from server_app.factory import build_strategy
from sim.presets import load_preset

PRESET = Path(__file__).resolve().parents[1] / "conf" / "selection-dev.toml"
ARM = "fedowen"  # Algorithm 2 with the defaults' valuation, guards and aggregation


def test_auto_is_algorithm_2_with_phi_and_random_without() -> None:
    assert registry.AUTO_WITH_PHI == "adaptive" and registry.AUTO_WITHOUT_PHI == "random"
    assert resolve_auto("owen-antithetic").selection == "adaptive"
    assert resolve_auto("none").selection == resolve_auto("multikrum").selection == "random"
    assert resolve_auto("owen-antithetic", "hics-phi").selection == "hics-phi"  # as written


def test_the_apps_defaults_run_the_adopted_arm_key_by_key() -> None:
    # Prepare: the arm as the grid ran it, and the app's defaults (selection auto) over the
    # same run length
    preset = load_preset(PRESET)
    arm = preset.variants[ARM]
    rounds = preset.base["num-server-rounds"]
    app = parse_run_config({"num-server-rounds": rounds})
    assert app.selection == "auto"
    # Execute: each key the arm pins, as the app resolves it (auto, -1 and 0 resolved)
    choices = app.choices()
    resolved = {"selection": choices.selection, "aggregation": choices.aggregation,
                "norm-cap": choices.norm_cap, "selection-cap": choices.cap}
    differ = {key: (resolved.get(key, getattr(app, key.replace("-", "_"))), value)
              for key, value in arm.items()
              if resolved.get(key, getattr(app, key.replace("-", "_"))) != value}
    # Assert: none differs, and the keys the arm leaves are the app's (so it ran them too)
    assert differ == {}
    assert set(arm) <= {key.replace("_", "-") for key in RunConfig.__dataclass_fields__}


def test_the_apps_defaults_build_the_arms_strategy() -> None:
    # Prepare: the grid's base with selection auto, and with the arm's keys
    preset = load_preset(PRESET)
    auto, arm = (build_strategy(parse_run_config({**preset.base, **keys}), no_utility, None)
                 for keys in ({"selection": "auto"}, preset.variants[ARM]))
    # Execute / Assert: the FedOwen the ServerApp builds runs the same, "auto" and -1 resolved
    assert auto.choices == arm.choices and auto.chooser.name == "adaptive"
    assert auto.valuation == arm.valuation
    assert auto.chooser.settings == arm.chooser.settings
    assert (auto.chooser.cap, auto.norm_cap) == (arm.chooser.cap, arm.norm_cap) == (0.0, "median")
    assert (replace(auto.guards, norm_cap=auto.norm_cap)
            == replace(arm.guards, norm_cap=arm.norm_cap))
    assert (replace(auto.selection_params, cap=auto.chooser.cap)
            == replace(arm.selection_params, cap=arm.chooser.cap))


def no_utility(*_: Any) -> Any:
    """A utility factory never called (the strategies are built, not run)."""
    raise AssertionError("not run")
