"""Issue 70's second acceptance point: each BatchNorm layer's running variance in the attacked
run's final model against the clean run's (final_model.pt of each run; not committed).

    python docs/results/backbone-acceptance/variance_ratio.py CLEAN_RUN_DIR ATTACKED_RUN_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch


def state(run: Path) -> dict[str, torch.Tensor]:
    loaded = torch.load(run / "final_model.pt", map_location="cpu", weights_only=False)
    return loaded.get("state_dict", loaded) if isinstance(loaded, dict) else loaded.state_dict()


def main() -> None:
    clean, attacked = (state(Path(arg)) for arg in sys.argv[1:3])
    layers = [k for k in clean if k.endswith("running_var")]
    by_max = {k: float(attacked[k].max() / clean[k].max()) for k in layers}
    by_entry = {k: float((attacked[k] / clean[k]).max()) for k in layers}
    print(f"{len(layers)} BatchNorm layers; layer max variance, attacked / clean: "
          f"{min(by_max.values()):.3f} to {max(by_max.values()):.3f}; largest entry ratio "
          f"{max(by_entry.values()):.3f}; largest variance clean "
          f"{max(float(clean[k].max()) for k in layers):.3f}, attacked "
          f"{max(float(attacked[k].max()) for k in layers):.3f}")


if __name__ == "__main__":
    main()
