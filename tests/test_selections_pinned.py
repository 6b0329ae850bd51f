"""Every selector's selections, pinned: seeded 20-round runs against a recorded copy.

The selectors moved behind one protocol (issue 62): each must still select the same clients
for a fixed seed. This test runs FedOwen itself (``start`` over an in-process grid: the
roster, the Power-of-Choice loss query as messages, Oort's squared losses in the train
config, the guards, the valuation and the round record) on a closed-form task of 20 clients
(no torch; tests/pinned_task.py): honest clients pull the model toward their own targets, two
push it away, one returns the model unchanged, four Sybils send near-parallel updates (links)
and one copies client 0 exactly (banned). Each scenario (every selector with its published or
default settings, plus variants that turn on the identity cap, link memory and the other keys)
runs 20 rounds; the records' ``selected`` and ``selection`` fields must match the copy in
``tests/data/selections.json``, recorded at 7518e93 (before the protocol; 33f049d, the
last commit before it, selects the same) by this file as committed in 9bb6e1a, whose
``strategy_of`` passed every key on the one ``SelectionParams`` of then.

HiCS-FL and hics-phi (issue 73) read each client's update of the output layer's bias, which
that model (one vector ``w``) lacks: their scenarios (:data:`WITH_BIAS`, at their defaults)
run the same task with an output layer beside ``w`` (``out.weight``, fixed, and ``out.bias``,
which each client moves toward its own label distribution by a cross-entropy step:
:func:`tests.pinned_task.bias_step`); the copy's ``added`` names the commit they were
recorded at. The other scenarios' model is ``w`` alone, as recorded; their entries were kept
as they were when these were added (``--record NAME``, below), and their rounds at that
commit are byte-identical to the copy's.

A second check resumes each scenario from the strategy state its run held after round 10
(as the ServerApp checkpoints it; for the 7518e93 scenarios saved by that code, so an old
checkpoint's state): rounds 11-20 must select as the uninterrupted run did.

To record a new copy after a change *meant* to change selections (say so in the commit):
``PYTHONPATH=. python tests/test_selections_pinned.py --record``; to add a new scenario's entry
(or record some again) and keep the others as they are: ``--record NAME ...``.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from flwr.app import ArrayRecord, MetricRecord

from fedowen_strategy import FedOwen, Guards, SelectionParams, ValuationSettings
from fedowen_strategy.replies import record_to_state, state_to_record
from fedowen_strategy.selectors import SELECTORS
from sim.inline_grid import InProcessGrid, task_identity
from tests.pinned_task import CLIENTS, handler, model_of, utility_factory

RECORDED = Path(__file__).parent / "data" / "selections.json"
K, ROUNDS, RESUME_AT, SEED = 6, 20, 10, 11

OWEN = {"method": "owen", "budget_m": 10, "game": "average"}
NONE = {"method": "none", "aggregation": "uniform"}
#: name -> (valuation settings, selection, selection params)
SCENARIOS: dict[str, tuple[dict[str, Any], str, dict[str, Any]]] = {
    "adaptive": (OWEN, "adaptive", {}),
    "random": (NONE, "random", {}),
    "posterior": (OWEN, "posterior", {}),
    "screened": (OWEN, "screened", {}),
    "power-of-choice": (NONE, "power-of-choice", {"poc_d": 10}),
    "oort": (NONE, "oort", {"oort_exploration_min": 0.1}),
    "adaptive-links-cap": (OWEN, "adaptive", {"link_memory": 1, "cap": 2.0,
                                              "memory": "discounted", "discount": 0.5}),
    "adaptive-latest": (OWEN, "adaptive", {"memory": "latest", "epsilon": 0.3}),
    "random-owen-cap": (OWEN, "random", {"cap": 1.5, "link_memory": 1}),
    "posterior-phi-nocap": (OWEN, "posterior", {"reward": "phi", "cap": 0.0,
                                                "resolve_level": 0.2}),
    "screened-cap": (OWEN, "screened", {"cap": 2.0, "resolve_level": 0.2}),
    "power-of-choice-owen": (OWEN, "power-of-choice", {"poc_d": 8, "link_memory": 1}),
    "oort-owen-cap": (OWEN, "oort", {"cap": 2.0}),
    "hics-fl": (NONE, "hics-fl", {}),
    "hics-phi": (OWEN, "hics-phi", {}),
}
#: The scenarios whose model has an output layer (``out.weight``, ``out.bias``) beside ``w``.
WITH_BIAS = frozenset({"hics-fl", "hics-phi"})


def strategy_of(name: str, on_round: Any) -> FedOwen:
    """The scenario's strategy: its shared keys on SelectionParams, the rest on the
    selector's settings."""
    valuation, selection, params = SCENARIOS[name]
    shared = {k: v for k, v in params.items() if k in SelectionParams.__dataclass_fields__}
    own = {k: v for k, v in params.items() if k not in shared}
    return FedOwen(clients_per_round=K, utility_factory=utility_factory,
                   valuation=ValuationSettings(**valuation),
                   selection=SELECTORS[selection].settings(**own),
                   selection_params=SelectionParams(**shared), guards=Guards(), seed=SEED,
                   on_round=on_round, node_wait_timeout=5.0)


def run(name: str, rounds: int = ROUNDS, saved: Mapping[str, Any] | None = None,
        offset: int = 0) -> dict[str, Any]:
    """One scenario's rounds (``selected`` and ``selection``), and, at round
    :data:`RESUME_AT`, the strategy's state and model as a checkpoint keeps them; from a
    copy's entry ``saved`` (its model and ``state``), a resumed run after round ``offset``."""
    rounds_out: list[dict[str, Any]] = []
    keep: dict[str, Any] = {}

    def on_round(server_round: int, record: dict[str, Any], rows: Any) -> None:
        kept = {"round": server_round, "selected": record["selected"]}
        if (selection := as_in_copy(record.get("selection", {}))) is not None:
            kept["selection"] = selection
        rounds_out.append(json.loads(json.dumps(kept)))

    strategy = strategy_of(name, on_round)
    if saved is not None:
        strategy.load_state_dict(json.loads(json.dumps(saved["state"])))
        strategy.round_offset = offset

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        if server_round + offset == RESUME_AT and saved is None:
            model = record_to_state(arrays)
            keep["state"] = json.loads(json.dumps(strategy.state_dict()))
            keep["w"] = [float(x) for x in model["w"]]
            if "out.bias" in model:
                keep["bias"] = [float(x) for x in model["out.bias"]]
        return MetricRecord({})

    with task_identity():
        strategy.start(grid=InProcessGrid(handler, [{"partition-id": i}
                                                    for i in range(CLIENTS)]),
                       initial_arrays=state_to_record(model_of(name in WITH_BIAS, saved)),
                       num_rounds=rounds, evaluate_fn=evaluate)
    return {"rounds": rounds_out, **keep}


def as_in_copy(selection: Mapping[str, Any]) -> dict[str, Any] | None:
    """A round record's ``selection`` as the copy's code wrote it. Since, the shared selection
    writes every selector's cost a round into it (``extra_messages``, ``selector_seconds``),
    and so a record for every selector: the copy has Power-of-Choice's messages as its
    ``query_messages``, and no ``selection`` where a selector recorded nothing of its choice
    (what is left then is the word ``how`` and the shared ``capped``)."""
    own = {k: v for k, v in selection.items() if k not in ("extra_messages", "selector_seconds")}
    if selection.get("extra_messages"):
        own["query_messages"] = selection["extra_messages"]
    return own if set(own) - {"how", "capped"} else None


#: A number's allowed relative difference from the copy. 1e-9 until issue 70, whose float32
#: server arithmetic (fedowen_strategy.updates: the aggregate, the caps, the norms in the
#: model's own float type) moved the recorded numbers by at most 4.3e-7 (posterior-phi-nocap's
#: heterogeneity_p; power-of-choice's candidate losses 1.3e-7) and no selection.
TOLERANCE = 1e-6


def differences(got: Any, want: Any, path: str = "") -> list[str]:
    """Where two decoded records differ: structure and discrete values exactly, numbers to
    :data:`TOLERANCE` (relative; float noise in a loss or a p-value, never a decision)."""
    if isinstance(want, dict) and isinstance(got, dict):
        if set(got) != set(want):
            return [f"{path}: keys {sorted(set(got) ^ set(want))}"]
        return [d for k in want for d in differences(got[k], want[k], f"{path}.{k}")]
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{path}: {len(got)} items, recorded {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True))
                for d in differences(g, w, f"{path}[{i}]")]
    if isinstance(want, float) and isinstance(got, float):
        ok = (math.isnan(got) and math.isnan(want)) or math.isclose(
            got, want, rel_tol=TOLERANCE, abs_tol=1e-12)
    else:
        ok = got == want and type(got) is type(want)
    return [] if ok else [f"{path}: {got!r}, recorded {want!r}"]


def recorded() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(RECORDED.read_text())
    return data


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_seeded_selections_are_the_recorded_ones(name: str) -> None:
    # Prepare
    want = recorded()["scenarios"][name]
    # Execute
    got = run(name)
    # Assert: 20 rounds, each selecting what 7518e93 selected
    assert len(got["rounds"]) == ROUNDS
    assert differences(got["rounds"], want["rounds"]) == []


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_run_resumed_from_a_recorded_state_selects_as_the_uninterrupted_one(name: str
                                                                              ) -> None:
    # Prepare: the strategy state 7518e93's code held after round 10 (what its checkpoint keeps)
    want = recorded()["scenarios"][name]
    # Execute
    got = run(name, ROUNDS - RESUME_AT, want, RESUME_AT)
    # Assert: rounds 11-20 as recorded
    assert differences(got["rounds"], want["rounds"][RESUME_AT:]) == []


def test_the_scenarios_exercise_every_selector_and_the_shared_parts() -> None:
    # Prepare / Execute
    data = recorded()["scenarios"]
    rounds = [r for s in data.values() for r in s["rounds"]]
    # Assert: every selector ran; the cap and the link groups acted somewhere; HiCS-FL and
    # hics-phi drew from more than one label-skew cluster (their model's output bias read)
    assert {SCENARIOS[n][1] for n in data} == {"adaptive", "random", "posterior", "screened",
                                               "power-of-choice", "oort", "hics-fl",
                                               "hics-phi"}
    assert any(r.get("selection", {}).get("capped", 0) > 0 for r in rounds)
    assert any(s["state"].get("pair_links") for s in data.values())
    for name in WITH_BIAS:
        drawn = [r["selection"] for r in data[name]["rounds"] if "clusters" in r["selection"]]
        assert len(drawn) >= ROUNDS - RESUME_AT
        assert all("output_bias" not in d for d in drawn)
        assert max(len(d["slots"]) if "slots" in d else len(d["cluster_p"]) for d in drawn) > 1


def record(names: Sequence[str]) -> None:
    """Run the scenarios ``names`` (every one when empty) and keep their rounds and round-10
    state: every one as a new copy, else those in the copy beside the others as they are (and
    the commit they were recorded at in its ``added``)."""
    import subprocess

    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        raise SystemExit(f"no scenario {unknown}: choose among {sorted(SCENARIOS)}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    copy = recorded() if names else {"commit": commit, "scenarios": {}}
    for name in names or SCENARIOS:
        copy["scenarios"][name] = run(name)
        if names:
            copy.setdefault("added", {})[name] = commit
        print(f"{name}: {[r['selected'] for r in copy['scenarios'][name]['rounds']][:2]} ...")
    RECORDED.write_text(json.dumps(copy, sort_keys=True, separators=(",", ":")) + "\n")
    print(f"recorded {RECORDED}")


if __name__ == "__main__":
    if sys.argv[1:2] != ["--record"]:
        raise SystemExit("usage: PYTHONPATH=. python tests/test_selections_pinned.py --record "
                         "[SCENARIO ...]")
    record(sys.argv[2:])
