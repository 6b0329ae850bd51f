"""What ``selection = "auto"`` runs: selection-peers-dev's ``hics-phi`` arm, the default its rule
adopted (conf/selection-peers-dev.toml, step 4), read from the preset so that a drift of
either the arm or the app's defaults fails here; FedAvg's uniform selection for a method that
computes no phi."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from fedowen_strategy.round.contribution import resolve_auto
from fedowen_strategy.selectors import registry
from server_app.config import RunConfig, parse_run_config
from server_app.factory import build_strategy
from sim.presets import load_preset

PRESET = Path(__file__).resolve().parents[1] / "conf" / "selection-peers-dev.toml"


def test_auto_is_hics_phi_with_phi_and_random_without() -> None:
    assert registry.AUTO_WITH_PHI == "hics-phi" and registry.AUTO_WITHOUT_PHI == "random"
    assert resolve_auto("owen-antithetic").selection == "hics-phi"
    assert resolve_auto("none").selection == resolve_auto("multikrum").selection == "random"
    assert resolve_auto("owen-antithetic", "adaptive").selection == "adaptive"  # as written


def test_the_apps_defaults_run_the_adopted_arm_key_by_key() -> None:
    # Prepare: the arm as the grid ran it, and the app's defaults (selection auto) over the
    # same run length (hics-rounds 0 resolves to it)
    preset = load_preset(PRESET)
    arm = preset.variants["hics-phi"]
    rounds = preset.base["num-server-rounds"]
    assert rounds == arm["hics-rounds"] == 100
    app = parse_run_config({"num-server-rounds": rounds})
    assert app.selection == "auto"
    # Execute: each key the arm pins, as the app resolves it (auto, -1 and 0 resolved)
    choices, settings = app.choices(), app.selector_settings()
    resolved = {"selection": choices.selection, "aggregation": choices.aggregation,
                "norm-cap": choices.norm_cap, "selection-cap": choices.cap,
                "hics-rounds": settings.hics_rounds}  # type: ignore[attr-defined]
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
                 for keys in ({"selection": "auto"}, preset.variants["hics-phi"]))
    # Execute / Assert: the FedOwen the ServerApp builds runs the same, "auto" and -1 resolved
    assert auto.choices == arm.choices and auto.chooser.name == "hics-phi"
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
