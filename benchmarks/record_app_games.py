r"""Record real rounds as the app plays them: full 2^n coalition tables (the estimator battery).

Each *run* is the app in one process: the ServerApp's strategy
(:func:`server_app.factory.build_strategy`, FedOwen with the run config's defaults:
``owen-antithetic`` at M = 4 on the delta game with neg-loss, softmax aggregation on the l1
scale, Algorithm 2's selection, the 2 x median norm cap, link-cosine 0.98) over the in-process grid
(:class:`sim.inline_grid.InProcessGrid`) whose 100 nodes are served by the real ClientApp
(long-tail IF 0.01, per-class Dirichlet(alpha) split, one local epoch of SGD). So the warm-up
before a recorded round is the app's own aggregation, not FedAvg. The utility factory is the
app's :class:`~fedowen_strategy.torch_utility.CoalitionUtility` on the server evaluation set
(1% of the training split, stratified: 600 images for MNIST and Fashion-MNIST, 500 for
CIFAR-10; the whole set, no subsample), wrapped to keep the inputs of the games the strategy
values in the chosen rounds: the global model, the (norm-capped) updates in client-id order,
their example counts and the delta game's shares. After the run each kept game is enumerated
(all 2^n coalitions, n = the round's players, 10 unless updates were linked) and its
first-order terms ``grad u(theta_0 + t D) . p_i delta_i`` are taken at t = 0, 1/2 and 1 (one
backward pass each; :mod:`fedowen_strategy.torch_utility.gradient`).

Models: LeNet-5 for MNIST and Fashion-MNIST, the small CNN (``model = "cnn"``) for CIFAR-10;
``--model resnet18`` records ResNet-18 games under their own keys (1-4 hours a table on a CPU
core: a GPU's work, docs/benchmarks.md section 12).

Output: one ``<dataset>_a<alpha>_r<round>_s<seed>.json.gz`` per game in ``--out`` (utilities
and first-order terms as float32, ``meta`` with the settings, the players' ids, shares, example
counts, update norms and timings; ``returned`` lists the clients in client-id order, and the
game's n players are those clients with each group in ``links`` merged into one, as the app
values them; read with ``TableGame.from_json``), and ``manifest.json``,
which splits the planned games into a development and a reporting half *before any is
recorded*: within every (dataset, alpha, round) cell a seeded shuffle of the seeds puts the
first half in ``dev`` and the rest in ``report``. Existing games are skipped on a rerun.

    PYTHONPATH=. FEDOWEN_DATA=/work/shared/data python benchmarks/record_app_games.py \
        --out tests/data/games

Measured on this project's 2-core machine, one torch thread, beside another experiment using
both cores: a run of 30 rounds took 120-130 s and a table 40-90 s (LeNet, 600 images; the CNN
on 500 CIFAR images likewise), 3-20 s when links left 6-9 players; the 36 games of the
defaults (3 datasets x 2 alphas x 2 seeds x rounds 3, 10, 30) took 53 minutes. Runs print one
line per round.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord

from client_app.app import app as client_app
from fedowen_strategy.torch_utility import CoalitionUtility
from fedowen_strategy.torch_utility.batched import CoalitionGame
from fedowen_strategy.updates import update_norm
from fedowen_strategy.valuation.exact import all_coalitions
from fedowen_task.data import load_dataset, resolve_data_dir
from fedowen_task.models import build_model
from fedowen_task.training import evaluate
from server_app.config import RunConfig, parse_run_config
from server_app.evaluation import server_sets
from server_app.factory import build_strategy
from server_app.progress import quiet
from sim.inline_grid import InProcessGrid, task_identity

FORMAT = "fedowen-app-game/1"
DATASETS = {"mnist": "lenet", "fashion-mnist": "lenet", "cifar10": "cnn"}
FIRST_ORDER_AT = (0.0, 0.5, 1.0)
NUM_PARTITIONS = 100
SPLIT_SEED = 27  # the number: fixes the dev/report split
_CHUNK = 256


@dataclass(frozen=True)
class Cell:
    """One planned game."""

    dataset: str
    alpha: float
    round: int
    seed: int
    model: str = ""  # "": the dataset's model in DATASETS

    @property
    def setting(self) -> str:
        """The dataset, and the model where it is not the dataset's (``cifar10-resnet18``)."""
        model = self.model or DATASETS[self.dataset]
        return self.dataset if model == DATASETS[self.dataset] else f"{self.dataset}-{model}"

    @property
    def key(self) -> str:
        return f"{self.setting}_a{self.alpha:g}_r{self.round:02d}_s{self.seed}"


def split_halves(cells: list[Cell]) -> dict[str, str]:
    """``key -> "dev" | "report"``: per (dataset, alpha, round), a seeded shuffle of its
    games, the first half (rounded down) to ``dev``; a lone game goes to ``dev``."""
    halves: dict[str, str] = {}
    groups: dict[tuple[str, float, int], list[Cell]] = {}
    for cell in cells:
        groups.setdefault((cell.setting, cell.alpha, cell.round), []).append(cell)
    for (setting, alpha, rnd), group in sorted(groups.items()):
        entropy = [SPLIT_SEED, sum(map(ord, setting)), int(alpha * 1000), rnd]
        order = np.random.default_rng(entropy).permutation(len(group))
        n_dev = max(1, len(group) // 2)
        for rank, idx in enumerate(order):
            halves[group[idx].key] = "dev" if rank < n_dev else "report"
    return halves


class CapturingUtility(CoalitionUtility):
    """The app's utility factory, keeping the inputs of the games of ``rounds``."""

    def __init__(self, *args: Any, rounds: set[int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rounds = rounds
        self.current = 1  # set by the strategy's round hook: the last logged round + 1
        self.kept: dict[int, dict[str, Any]] = {}

    def __call__(self, global_state: Any, client_states: Any, num_examples: Any,
                 shares: Any = None) -> CoalitionGame:
        if self.current in self.rounds:
            self.kept[self.current] = {
                "global": {k: np.array(v) for k, v in global_state.items()},
                "states": [{k: np.array(v) for k, v in s.items()} for s in client_states],
                "num_examples": [int(m) for m in num_examples],
                "shares": None if shares is None else [float(p) for p in shares]}
        return super().__call__(global_state, client_states, num_examples, shares=shares)


def run_config(dataset: str, alpha: float, seed: int, rounds: int, data_dir: str,
               **extra: Any) -> RunConfig:
    """The app's run config with this run's dataset, model, alpha, seed and length; ``extra``
    (run-config keys with ``_`` for ``-``: ``model``, ``device``, ``client_max_samples``,
    ``clients_per_round``) where given."""
    cfg: dict[str, Any] = {
        "dataset": dataset, "model": DATASETS[dataset], "alpha": alpha, "seed": seed,
        "num-server-rounds": rounds, "data-dir": data_dir, "device": "cpu",
        "torch-threads": 1}
    cfg.update({k.replace("_", "-"): v for k, v in extra.items() if v})
    return parse_run_config(cfg)


def play(cfg: RunConfig, rounds: set[int]) -> tuple[CapturingUtility, dict[int, dict]]:
    """Run ``cfg`` in this process; the capturing factory and the strategy's round records."""
    ds = load_dataset(cfg.dataset, resolve_data_dir(cfg.data_dir or None))
    sets = server_sets(cfg, ds)
    model = build_model(cfg.model_name(), ds.in_channels, ds.num_classes, seed=cfg.seed)
    factory = CapturingUtility(model, sets[0], sets[1], metric=cfg.utility_metric,
                               device=cfg.torch_device(), rounds=rounds)
    strategy = build_strategy(cfg, factory, None)
    records: dict[int, dict] = {}
    started = time.perf_counter()

    def on_round(server_round: int, record: dict[str, Any], rows: list[dict]) -> None:
        records[server_round] = record
        factory.current = server_round + 1
        print(f"  round {server_round:3d}: nu(N) = {record.get('nu_full', float('nan')):.4f}, "
              f"{len(record.get('returned', []))} updates, links {record.get('links', [])}, "
              f"{time.perf_counter() - started:.0f}s", flush=True)

    strategy.on_round = on_round
    nodes = [{"partition-id": i, "num-partitions": NUM_PARTITIONS}
             for i in range(NUM_PARTITIONS)]
    run_cfg = {k.replace("_", "-"): v for k, v in vars(cfg).items()}
    with task_identity(), quiet(False):
        grid = InProcessGrid(client_app, nodes, run_cfg)
        strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                       num_rounds=cfg.num_server_rounds, timeout=cfg.round_timeout,
                       train_config=ConfigRecord())
    return factory, records


def f32(values: Any) -> list[float]:
    """Shortest decimals of the float32 values (the files stay small)."""
    return [float(str(v)) for v in np.asarray(values, dtype=np.float32)]


def table_of(game: CoalitionGame) -> tuple[np.ndarray, float]:
    """All 2^n utilities by bit code, and the seconds they took."""
    n = game.n
    out = np.empty(1 << n)
    started = time.perf_counter()
    for start in range(0, 1 << n, _CHUNK):
        stop = min(start + _CHUNK, 1 << n)
        out[start:stop] = game(all_coalitions(n, start, stop))
    return out, time.perf_counter() - started


def record_game(cell: Cell, cfg: RunConfig, factory: CapturingUtility,
                record: dict[str, Any]) -> dict[str, Any]:
    """Enumerate a kept game and collect its first-order terms and metadata."""
    kept = factory.kept[cell.round]
    game = factory(kept["global"], kept["states"], kept["num_examples"], shares=kept["shares"])
    table, seconds = table_of(game)
    started = time.perf_counter()
    terms = {f"{at:g}": game.first_order(at) for at in FIRST_ORDER_AT}
    seconds_fo = (time.perf_counter() - started) / len(FIRST_ORDER_AT)
    ds = load_dataset(cfg.dataset, resolve_data_dir(cfg.data_dir or None))
    x_eval, y_eval = server_sets(cfg, ds)[:2]
    accuracy = {}
    for name, state in (("global", kept["global"]), ("grand", _grand(kept))):
        net = build_model(cfg.model_name(), ds.in_channels, ds.num_classes)
        net.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
        accuracy[name] = evaluate(net, x_eval, y_eval)[1]
    meta = {
        "dataset": cell.dataset, "model": cfg.model_name(), "alpha": cell.alpha,
        "client_max_samples": cfg.client_max_samples, "device": cfg.torch_device(),
        "imbalance_factor": cfg.imbalance_factor, "partition_scheme": cfg.partition_scheme,
        "num_partitions": NUM_PARTITIONS, "round": cell.round, "seed": cell.seed,
        "n": game.n, "eval_size": len(y_eval), "game": cfg.game, "metric": cfg.utility_metric,
        "warmup": "the app's own rounds (FedOwen defaults: owen M=4, softmax, adaptive "
                  "selection, 2 x median norm cap, links at cosine 0.98)",
        "returned": record.get("returned", []), "links": record.get("links", []),
        "shares": kept["shares"], "num_examples": kept["num_examples"],
        "update_norms": [update_norm(s, kept["global"]) for s in kept["states"]],
        "nu_empty": float(table[0]), "nu_grand": float(table[-1]),
        "eval_accuracy_global": accuracy["global"], "eval_accuracy_grand": accuracy["grand"],
        "first_order_note": "first_order[t][i] = grad u(theta_0 + t D) . p_i delta_i, "
                            "u = minus the mean cross-entropy on the evaluation set",
        "seconds_table": round(seconds, 2), "seconds_per_eval": seconds / len(table),
        "seconds_first_order": seconds_fo, "torch_threads": torch.get_num_threads(),
    }
    return {"format": FORMAT, "utilities": f32(table),
            "first_order": {k: f32(v) for k, v in terms.items()}, "meta": meta}


def _grand(kept: dict[str, Any]) -> dict[str, np.ndarray]:
    """The grand coalition's model: global + sum p_i (W_i - global)."""
    p, glob = kept["shares"], kept["global"]
    out = {}
    for key, g in glob.items():
        if not np.issubdtype(g.dtype, np.floating):
            out[key] = g
            continue
        step = sum(pi * (s[key].astype(np.float64) - g) for pi, s in zip(p, kept["states"],
                                                                          strict=True))
        out[key] = (g + step).astype(g.dtype)
    return out


def write_game(path: Path, payload: dict[str, Any]) -> None:
    with gzip.open(path, "wt", compresslevel=9) as fh:
        json.dump(payload, fh, separators=(",", ":"))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="tests/data/games")
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    p.add_argument("--alphas", type=float, nargs="+", default=[0.1, 0.01])
    p.add_argument("--rounds", type=int, nargs="+", default=[3, 30])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--data-dir", default="", help="default: $FEDOWEN_DATA or ../shared/data")
    p.add_argument("--model", default="",
                   help="another model than the dataset's (e.g. resnet18 for cifar10; the "
                        "games' keys then read cifar10-resnet18_...)")
    p.add_argument("--client-max-samples", type=int, default=0,
                   help="the run config's client-max-samples (0: the app's default)")
    p.add_argument("--clients-per-round", type=int, default=0,
                   help="players a round (0: the app's 10; fewer only for a smoke)")
    p.add_argument("--device", default="cpu", help="where the runs and tables go (cpu, cuda)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data_dir = str(resolve_data_dir(args.data_dir or None))
    cells = [Cell(d, a, r, s, args.model) for d, a, s, r in
             itertools.product(args.datasets, args.alphas, args.seeds, sorted(args.rounds))]
    manifest = out / "manifest.json"
    halves = split_halves(cells)
    if manifest.exists():  # a rerun adds games; the halves of recorded games never change
        halves.update(json.loads(manifest.read_text())["halves"])
    manifest.write_text(json.dumps({
        "split": f"per (dataset, alpha, round): a shuffle seeded by {SPLIT_SEED} and the cell "
                 "puts half of its seeds in dev, the rest in report; written before recording",
        "halves": dict(sorted(halves.items()))}, indent=1) + "\n")
    for (dataset, alpha, seed), group in itertools.groupby(
            cells, key=lambda c: (c.dataset, c.alpha, c.seed)):
        todo = [c for c in group if not (out / f"{c.key}.json.gz").exists()]
        if not todo:
            continue
        print(f"{dataset} alpha={alpha:g} seed={seed}: rounds "
              f"{[c.round for c in todo]}", flush=True)
        cfg = run_config(dataset, alpha, seed, max(c.round for c in todo), data_dir,
                         model=args.model, device=args.device,
                         client_max_samples=args.client_max_samples,
                         clients_per_round=args.clients_per_round)
        factory, records = play(cfg, {c.round for c in todo})
        for cell in todo:
            payload = record_game(cell, cfg, factory, records[cell.round])
            write_game(out / f"{cell.key}.json.gz", payload)
            meta = payload["meta"]
            print(f"  {cell.key}: n={meta['n']}, table {meta['seconds_table']}s, "
                  f"gain {meta['nu_grand'] - meta['nu_empty']:+.4f}, eval accuracy "
                  f"{meta['eval_accuracy_global']:.3f} -> {meta['eval_accuracy_grand']:.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
