"""A fake ``flwr run`` and small presets for the runner's, the reports' and the ablations'
tests (no Ray)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.presets import parse_preset
from sim.runner import Runner


def small_preset(**grid_extra: Any) -> dict[str, Any]:
    grid = {"name": "t", "axes": {"seed": [0, 1], "alpha": [0.01, 0.1],
                                  "valuation": ["owen", "none"]}, **grid_extra}
    return {"preset": {"name": "unit", "num-supernodes": 10},
            "base": {"dataset": "mnist", "num-server-rounds": 3}, "grid": [grid]}


@dataclass
class Outcome:
    status: str

    @property
    def ok(self) -> bool:
        return self.status == "finished:completed"


@dataclass
class FakeLink:
    flwr_home: Path
    name: str = "fake"


@contextmanager
def fake_link(home: Path) -> Iterator[FakeLink]:
    yield FakeLink(home)


def write_rounds(out: Path, accs: list[float], extra: dict[str, Any] | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "rounds.jsonl").open("w") as fh:
        for rnd, acc in enumerate(accs):
            rec = {"round": rnd, "test_accuracy": acc}
            if rnd:
                rec.update({"valuation_seconds": 0.5, "n_evals": 40, **(extra or {})})
            fh.write(json.dumps(rec) + "\n")


class FakeFlwr:
    """Plays ``flwr_run``: per call, the next scripted behaviour (ok | fail | crash-after-ckpt)."""

    def __init__(self, script: list[str]) -> None:
        self.script = list(script)
        self.calls: list[dict[str, Any]] = []

    def __call__(self, link: Any, cfg: dict[str, Any], **kw: Any) -> Outcome:
        self.calls.append(cfg)
        what = self.script.pop(0) if self.script else "ok"
        out = Path(cfg["output-dir"])
        rounds = cfg["num-server-rounds"]
        if what == "ok":
            write_rounds(out, [0.1 * (r + 1) for r in range(rounds + 1)])
            (out / "summary.json").write_text("{}")
            return Outcome("finished:completed")
        if what == "crash-after-ckpt":
            write_rounds(out, [0.1, 0.2])
            (out / "checkpoint.npz").write_bytes(b"x")
        kw["stream_to"].write("Traceback: boom\n")
        return Outcome("finished:failed")


def make_runner(tmp_path: Path, fake: FakeFlwr, preset: dict[str, Any] | None = None) -> Runner:
    raw = preset or small_preset(axes={"seed": [0], "valuation": ["owen", "none"]})
    return Runner(parse_preset(raw), tmp_path / "res", tmp_path / "data", run_fn=fake,
                  link_factory=fake_link, progress=lambda msg: None)


VARIANTS = {"fedavg-equal": {"valuation": "none", "aggregation": "uniform"},
            "fedowen": {"valuation": "owen"}}


def ablation_preset(**grid_extra: Any) -> dict[str, Any]:
    grid = {"name": "abl", "kind": "ablation", "reference": "fedavg-equal", "rows": "variant",
            "axes": {"seed": [0, 1, 2], "alpha": [0.1], "variant": list(VARIANTS)},
            **grid_extra}
    return {"preset": {"name": "abl", "num-supernodes": 10, "backend": "inline"},
            "base": {"dataset": "mnist", "num-server-rounds": 3},
            "variants": VARIANTS, "grid": [grid]}
