"""Attack success of each smoke arm's final model under both smoke triggers (the clean arm's
is the baseline a model never attacked reaches), on the runs' own test images.

    python docs/results/backdoor-attacks-smoke/final_asr.py RUNS
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from fedowen_task.adversary.backdoor import attack_success
from fedowen_task.adversary.keys import Trigger
from fedowen_task.data import load_dataset, resolve_data_dir, white
from fedowen_task.models import build_model
from server_app.config import parse_run_config
from server_app.evaluation import server_sets

TRIGGERS = {"square 3x3 bottom-right": Trigger(),
            "bars 4x(1x4) top-left": Trigger(shape="bars", size=4, position="top-left")}


def main(argv: list[str]) -> int:
    runs = Path(argv[0])
    print("| arm | final test accuracy | " + " | ".join(TRIGGERS) + " |")
    print("|---|---|" + "---|" * len(TRIGGERS))
    for run in sorted(p for p in runs.iterdir() if (p / "final_model.pt").exists()):
        cfg = parse_run_config({k: v for k, v in json.loads((runs / f"{run.name}.json")
                                                            .read_text()).items()})
        ds = load_dataset(cfg.dataset, resolve_data_dir(cfg.data_dir))
        sets = server_sets(cfg, ds)
        model = build_model(cfg.model_name(), ds.in_channels, ds.num_classes)
        model.load_state_dict(torch.load(run / "final_model.pt"))
        acc = float((model.eval()(sets.x_test).argmax(1) == sets.y_test).float().mean())
        rates = [attack_success(model, sets.x_test, sets.y_test, t, white(cfg.dataset))
                 for t in TRIGGERS.values()]
        print(f"| `{run.name}` | {100 * acc:.1f} | "
              + " | ".join(f"{100 * r:.1f}" for r in rates) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
