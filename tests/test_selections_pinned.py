"""Every selector's selections, pinned: seeded 20-round runs against a recorded copy.

The selectors moved behind one protocol (issue 62): each must still select the same clients
for a fixed seed. This test runs FedOwen itself (``start`` over an in-process grid: the
roster, the Power-of-Choice loss query as messages, Oort's squared losses in the train
config, the guards, the valuation and the round record) on a closed-form task of 20 clients
(no torch): honest clients pull the model toward their own targets, two push it away, one
returns the model unchanged, four Sybils send near-parallel updates (links) and one copies
client 0 exactly (banned). Each scenario (every selector with its published or default
settings, plus variants that turn on the identity cap, link memory and the other keys)
runs 20 rounds; the records' ``selected`` and ``selection`` fields must match the copy in
``tests/data/selections.json``, recorded at 7518e93 (before the protocol; 33f049d, the
last commit before it, selects the same) by this file as committed in 9bb6e1a, whose
``strategy_of`` passed every key on the one ``SelectionParams`` of then.

A second check resumes each scenario from the strategy state its run held after round 10
(as the ServerApp checkpoints it; saved by 7518e93's code, so an old checkpoint's state):
rounds 11-20 must select as the uninterrupted run did.

To record a new copy after a change *meant* to change selections (say so in the commit):
``PYTHONPATH=. python tests/test_selections_pinned.py --record``.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from fedowen_strategy import FedOwen, Guards, SelectionParams, ValuationSettings
from fedowen_strategy.replies import record_to_state, state_to_record
from fedowen_strategy.selectors import SELECTORS
from fedowen_task.protocol import LOCAL_LOSS_FIELD, LOSS_SQUARES_FIELD
from sim.inline_grid import InProcessGrid, task_identity

RECORDED = Path(__file__).parent / "data" / "selections.json"
CLIENTS, K, ROUNDS, RESUME_AT, DIM, SEED = 20, 6, 20, 10, 16, 11
BAD, FREE_RIDER, SYBILS, COPIER = (12, 13), 11, (14, 15, 16, 17), 19
#: Each client's target: a common one plus its own offset (fixed, not drawn at run time).
_TABLE = np.random.default_rng(2024)
COMMON = _TABLE.normal(size=DIM)
TARGETS = COMMON + 0.8 * _TABLE.normal(size=(CLIENTS, DIM))
TARGETS[list(SYBILS)] = TARGETS[SYBILS[0]]
EXAMPLES = 20 + _TABLE.integers(0, 80, size=CLIENTS)

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
}


def step(pid: int, w: np.ndarray, server_round: int) -> np.ndarray:
    """Client ``pid``'s new model from ``w`` in ``server_round`` (deterministic)."""
    if pid == COPIER:
        return step(0, w, server_round)
    if pid == FREE_RIDER:
        return w.copy()
    noise = np.random.default_rng([pid, server_round]).normal(size=DIM)
    scale = 1e-3 if pid in SYBILS else 0.05
    toward = TARGETS[pid] - w
    move = -toward if pid in BAD else 0.5 * toward
    return (w + move + scale * noise).astype(np.float32)


def local_loss(pid: int, w: np.ndarray) -> float:
    """The model's loss on client ``pid``'s data: the squared distance to its target."""
    return float(np.sum((TARGETS[pid] - w) ** 2))


def handler(msg: Message, ctx: Context) -> Message:
    pid = int(ctx.node_config["partition-id"])
    client = ConfigRecord({"client-id": f"c{pid}"})
    config = msg.content.config_records.get("config")
    if msg.metadata.message_type == "query":
        content = RecordDict({"client": client})
        if config is not None and config.get(LOCAL_LOSS_FIELD):
            w = record_to_state(msg.content["arrays"])["w"]
            content["metrics"] = MetricRecord({LOCAL_LOSS_FIELD: local_loss(pid, w),
                                               "num-examples": int(EXAMPLES[pid])})
        return Message(content, reply_to=msg)
    assert config is not None
    w = record_to_state(msg.content["arrays"])["w"]
    server_round = int(config["server-round"])  # type: ignore[arg-type]
    new = step(pid, w, server_round)
    loss = local_loss(pid, new)
    metrics = MetricRecord({"num-examples": int(EXAMPLES[pid]), "train-loss": loss})
    if config.get(LOSS_SQUARES_FIELD):
        metrics[LOSS_SQUARES_FIELD] = float(EXAMPLES[pid]) * loss ** 2
    return Message(RecordDict({"arrays": state_to_record({"w": new}), "metrics": metrics,
                               "client": client}), reply_to=msg)


def utility_factory(global_state: Mapping[str, np.ndarray],
                    states: Sequence[Mapping[str, np.ndarray]], examples: Sequence[int]) -> Any:
    ws = np.stack([s["w"] for s in states]).astype(np.float64)
    n_ex = np.asarray(examples, dtype=np.float64)

    def utility(masks: np.ndarray) -> np.ndarray:
        out = np.empty(len(masks))
        for r, m in enumerate(masks):
            w = global_state["w"] if not m.any() else (n_ex[m] @ ws[m]) / n_ex[m].sum()
            out[r] = -float(np.sum((w - COMMON) ** 2))
        return out

    return utility


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


def run(name: str, rounds: int = ROUNDS, w0: Sequence[float] | None = None,
        state: Mapping[str, Any] | None = None, offset: int = 0) -> dict[str, Any]:
    """One scenario's rounds (``selected`` and ``selection``), and, at round
    :data:`RESUME_AT`, the strategy's state and model as a checkpoint keeps them."""
    rounds_out: list[dict[str, Any]] = []
    saved: dict[str, Any] = {}

    def on_round(server_round: int, record: dict[str, Any], rows: Any) -> None:
        kept = {"round": server_round, "selected": record["selected"]}
        if (selection := as_in_copy(record.get("selection", {}))) is not None:
            kept["selection"] = selection
        rounds_out.append(json.loads(json.dumps(kept)))

    strategy = strategy_of(name, on_round)
    if state is not None:
        strategy.load_state_dict(json.loads(json.dumps(state)))
        strategy.round_offset = offset

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        if server_round + offset == RESUME_AT and state is None:
            saved["state"] = json.loads(json.dumps(strategy.state_dict()))
            saved["w"] = [float(x) for x in record_to_state(arrays)["w"]]
        return MetricRecord({})

    start = np.zeros(DIM, np.float32) if w0 is None else np.asarray(w0, np.float32)
    with task_identity():
        strategy.start(grid=InProcessGrid(handler, [{"partition-id": i}
                                                    for i in range(CLIENTS)]),
                       initial_arrays=state_to_record({"w": start}), num_rounds=rounds,
                       evaluate_fn=evaluate)
    return {"rounds": rounds_out, **saved}


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
    got = run(name, ROUNDS - RESUME_AT, want["w"], want["state"], RESUME_AT)
    # Assert: rounds 11-20 as recorded
    assert differences(got["rounds"], want["rounds"][RESUME_AT:]) == []


def test_the_scenarios_exercise_every_selector_and_the_shared_parts() -> None:
    # Prepare / Execute
    data = recorded()["scenarios"]
    rounds = [r for s in data.values() for r in s["rounds"]]
    # Assert: every selector ran; the cap and the link groups acted somewhere
    assert {SCENARIOS[n][1] for n in data} == {"adaptive", "random", "posterior", "screened",
                                               "power-of-choice", "oort"}
    assert any(r.get("selection", {}).get("capped", 0) > 0 for r in rounds)
    assert any(s["state"].get("pair_links") for s in data.values())


def record() -> None:
    """Run every scenario and keep its rounds and round-10 state as the new copy."""
    import subprocess

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    scenarios = {}
    for name in SCENARIOS:
        scenarios[name] = run(name)
        print(f"{name}: {[r['selected'] for r in scenarios[name]['rounds']][:2]} ...")
    RECORDED.write_text(json.dumps({"commit": commit, "scenarios": scenarios},
                                   sort_keys=True, separators=(",", ":")) + "\n")
    print(f"recorded {RECORDED}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        raise SystemExit("usage: PYTHONPATH=. python tests/test_selections_pinned.py --record")
    record()
