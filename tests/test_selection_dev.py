"""The selection development grid's rule (sim.selection_dev) on hand-built scores."""

from __future__ import annotations

from sim.selection_dev import CONTENDERS, VAL, Setting, verdict


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
