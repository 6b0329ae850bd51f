r"""Issue 59, point 5: ResNet-18 on CIFAR-10 on one GPU machine, in phases that each stop on time.

Each phase starts its runs as ``python -m sim.inline`` processes (the real ServerApp and
ClientApp in one process, no Ray: ``sim/inline.py``), 100 clients, 10 a round, clients and server
on ``device`` (``cuda`` on the GPU profile), and follows their ``rounds.jsonl`` as they write
it, printing one line per round. A phase past its cap (or the call's deadline) has its runs
stopped; the rounds they wrote are kept. After every phase the summary files and the records
tarball under ``--out`` are rewritten (:mod:`benchmarks.gpu_resnet18_summary`), so a call cut
at any point returns what it measured.

Phases of the ``gpu`` profile (the order is the priority; caps in seconds):

* ``alone-fedowen``: FedOwen as shipped, seed 0, 30 rounds alone (150): seconds a round alone,
  the valuation's share, and the FedOwen arm of the smoke run;
* ``alone-fedavg-equal``: equal-weight FedAvg (the second confirmation's ``fedavg-equal``:
  ``valuation = "none"``, ``selection = "random"``, ``aggregation = "uniform"``), seed 0, 30
  rounds (90): the smoke run's other arm;
* ``concurrent-4`` / ``-8`` / ``-16``: 4 / 8 / 16 FedOwen runs at once, seeds from 1, 8
  rounds each (80 / 100 / 90): seconds a round under contention (16 runs only where time is
  left: a phase with under ``MIN_CAP_S`` seconds is skipped).

Both arms train CIFAR-10's ``model = "auto"`` with that model's own recipe (issue 70: the
per-model recipe; ``TaskConfig.model_name`` says which model). The ``gpu-backbone`` profile
runs backbone-dev's four arms (``conf/backbone-dev.toml``: equal-weight FedAvg, ``resnet18`` at
lr 0.01 / 0.03, ``resnet18-gn`` at 0.003 / 0.01, its caps) at once for 30 rounds on seed 0:
the CPU grid's 8-round picks re-read over more rounds, by validation accuracy.

The ``smoke`` profile is the same on MNIST LeNet with tiny caps on the CPU, 2 rounds (its
``concurrent-2`` phase asks for more rounds than its cap allows, so the cut path runs too)::

    python -m benchmarks.gpu_resnet18 --profile smoke --data-dir D --work /tmp/w --out /tmp/o

``scripts/gpu-resnet18.sh`` sets up the machine and calls this (docs/results/gpu-resnet18/).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.gpu_resnet18_summary import pack_records, write_summary
from fedowen_deploy.procs import stop_tree
from sim.inline import child_env
from sim.presets import load_preset

ROOT = Path(__file__).resolve().parents[1]
NUM_SUPERNODES = 100
#: A phase with less time than this left is skipped (16 processes take ~20 s to start).
MIN_CAP_S = 45.0
#: The development grid whose cells the ``gpu-backbone`` profile re-reads at 30 rounds.
BACKBONE = load_preset(ROOT / "conf" / "backbone-dev.toml")
#: The arms: FedOwen as shipped, and equal-weight FedAvg as conf/confirm2/ names it.
ARMS: dict[str, dict[str, Any]] = {
    "fedowen": {},
    "fedavg-equal": {"valuation": "none", "selection": "random", "aggregation": "uniform"},
    # backbone-dev's four cells of seed 0 (conf/backbone-dev.toml: each grid's model at its
    # lrs), re-read at 30 rounds where the CPU grid ran 8; their base keys are the profile's
    **{f"fedavg-equal-{grid.fixed['model']}-lr{lr}": {"model": grid.fixed["model"], "lr": lr}
       for grid in BACKBONE.grids for lr in grid.axes["lr"]},
}
#: The run config both profiles share: 10 clients a round, evaluation every round.
COMMON: dict[str, Any] = {"clients-per-round": 10, "eval-every": 1, "torch-threads": 1}
PROFILES: dict[str, dict[str, Any]] = {
    # the second confirmation's CIFAR-10 setting (conf/confirm2/cifar10.toml) with CIFAR-10's
    # auto model and that model's own recipe (fedowen_task/models.py, issue 70); no caps:
    # partitions hold ~110 images at IF 0.01 and alpha 0.1
    "gpu": {"dataset": "cifar10", "validation-fraction": 0.05, "device": "cuda"},
    # backbone-dev's base (equal-weight FedAvg, its caps and pinned guards) on the GPU
    "gpu-backbone": {**{k: v for k, v in BACKBONE.base.items() if k != "num-server-rounds"},
                     "device": "cuda"},
    "smoke": {"dataset": "mnist", "model": "lenet", "device": "cpu",
              "client-max-samples": 20, "test-max-samples": 200},
}


@dataclass(frozen=True)
class Phase:
    """Runs started together: ``jobs`` runs of ``arm`` (seeds from ``first_seed``), each asked
    for ``rounds`` rounds, stopped after ``cap_s`` seconds."""

    name: str
    arm: str
    jobs: int
    rounds: int
    cap_s: float
    first_seed: int = 0


PHASES: dict[str, tuple[Phase, ...]] = {
    "gpu": (Phase("alone-fedowen", "fedowen", 1, 30, 150),
            Phase("alone-fedavg-equal", "fedavg-equal", 1, 30, 90),
            Phase("concurrent-4", "fedowen", 4, 8, 80, first_seed=1),
            Phase("concurrent-8", "fedowen", 8, 8, 100, first_seed=1),
            Phase("concurrent-16", "fedowen", 16, 8, 90, first_seed=1)),
    # backbone-dev's four arms at once (CONCURRENT), seed 0 (a development seed), 30 rounds:
    # the CPU grid's picks (8 rounds) re-read by validation accuracy over more rounds
    "gpu-backbone": tuple(Phase(f"alone-{arm}", arm, 1, 30, 400)
                          for arm in ARMS if arm.startswith("fedavg-equal-resnet")),
    "smoke": (Phase("alone-fedowen", "fedowen", 1, 2, 60),
              Phase("alone-fedavg-equal", "fedavg-equal", 1, 2, 60),
              Phase("concurrent-2", "fedowen", 2, 200, 50, first_seed=1)),
}


#: Profiles whose phases run at the same time (each phase in its own thread).
CONCURRENT = ("gpu-backbone",)


def run_config(profile: str, phase: Phase, seed: int, out_dir: Path,
               data_dir: str) -> dict[str, Any]:
    """One run's run config: the profile's, the arm's keys, the phase's rounds, the seed."""
    return {**COMMON, **PROFILES[profile], **ARMS[phase.arm], "seed": seed,
            "num-server-rounds": phase.rounds, "output-dir": str(out_dir), "data-dir": data_dir}


def read_rounds(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a ``rounds.jsonl`` that may still be being written."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines() if line]


def round_line(phase: str, run: str, rec: dict[str, Any], total: int) -> str:
    """``[gpu-resnet18] concurrent-4 s2 round 3/8: round 1.92s | valuation 0.41s | test
    accuracy 23.10% | 10 returned, 0 rejected``."""
    parts = [f"[gpu-resnet18] {phase} {run} round {rec['round']}/{total}:"]
    if not rec.get("round"):
        parts.append("the initial model")
    else:
        parts.append(f"round {float(rec.get('round_seconds') or 0):.2f}s")
    if rec.get("valuation_seconds") is not None:
        parts.append(f"| valuation {float(rec['valuation_seconds']):.2f}s")
    if rec.get("test_accuracy") is not None:
        parts.append(f"| test accuracy {100 * float(rec['test_accuracy']):.2f}%")
    if rec.get("round"):
        parts.append(f"| {len(rec.get('returned') or [])} returned, "
                     f"{len(rec.get('rejected') or {})} rejected, "
                     f"{len(rec.get('failed') or {})} failed")
    return " ".join(parts)


class GpuSampler(threading.Thread):
    """``nvidia-smi``'s utilisation and memory once a second, tagged with the phase running
    (``gpu.csv``: epoch seconds, phase, percent, MiB); nothing where there is no nvidia-smi."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.phase, self.stop = path, "setup", threading.Event()

    def run(self) -> None:
        query = ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
                 "--format=csv,noheader,nounits"]
        with self.path.open("a") as fh:
            while not self.stop.wait(1.0):
                try:
                    out = subprocess.run(query, capture_output=True, text=True, timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    return
                util, mem = (out.stdout.splitlines() or ["?, ?"])[0].split(",")[:2]
                fh.write(f"{time.time():.1f},{self.phase},{util.strip()},{mem.strip()}\n")
                fh.flush()


def run_phase(phase: Phase, profile: str, runs_dir: Path, data_dir: str,
              cap_s: float) -> dict[str, Any]:
    """Start the phase's runs, print their rounds as they come, stop them after ``cap_s``;
    returns the phase's record (``phase.json`` beside its runs)."""
    pdir = runs_dir / phase.name
    pdir.mkdir(parents=True, exist_ok=True)
    procs: dict[str, subprocess.Popen[str]] = {}
    seen: dict[str, int] = {}
    started = time.time()
    record: dict[str, Any] = {**asdict(phase), "cap_s": round(cap_s, 1), "started": started}
    (pdir / "phase.json").write_text(json.dumps(record, indent=1))
    try:
        for k in range(phase.jobs):
            seed = phase.first_seed + k
            name = f"s{seed}"
            cfg = run_config(profile, phase, seed, pdir / name, data_dir)
            cfg_file = pdir / f"{name}.json"
            cfg_file.write_text(json.dumps(cfg, indent=1))
            with (pdir / f"{name}.log").open("w") as log_fh:
                procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "sim.inline", "--run-config", str(cfg_file),
                     "--num-supernodes", str(NUM_SUPERNODES)],
                    env=child_env(cfg), cwd=ROOT, stdout=log_fh, stderr=subprocess.STDOUT,
                    text=True, start_new_session=True)
            seen[name] = 0
        while any(p.poll() is None for p in procs.values()) and time.time() - started < cap_s:
            time.sleep(2.0)
            _print_new(phase, pdir, seen)
    finally:  # the cap, a finished phase, or SIGTERM: no run is left behind
        cut = [name for name, p in procs.items() if p.poll() is None]
        for name in cut:
            stop_tree(procs[name], grace=5)
        _print_new(phase, pdir, seen)
        record.update(seconds=round(time.time() - started, 1), cut=cut,
                      exit_codes={name: p.poll() for name, p in procs.items()})
        (pdir / "phase.json").write_text(json.dumps(record, indent=1))
        print(f"[gpu-resnet18] {phase.name} done in {record['seconds']}s"
              + (f"; cut: {', '.join(cut)}" if cut else ""), flush=True)
    return record


def phase_line(ph: dict[str, Any]) -> str:
    """``[gpu-resnet18] concurrent-4: 4 runs, 32 rounds; median round 2.10s (wall 2.40s),
    valuation 0.80s = 38%; 1667 rounds/h across the machine; GPU 61% (max 12000 MiB); 0
    rejected``."""
    runs = ph["runs"].values()

    def num(v: float | None, fmt: str) -> str:
        return "?" if v is None else format(v, fmt)

    gpu = ph.get("gpu") or {}
    return (f"[gpu-resnet18] {ph['name']}: {ph['jobs']} runs, "
            f"{sum(r['rounds_done'] for r in runs)} rounds; median round "
            f"{num(ph['round_seconds_median'], '.2f')}s "
            f"(wall {num(ph['wall_seconds_median'], '.2f')}s), "
            f"valuation {num(ph['valuation_seconds_median'], '.2f')}s = "
            f"{num(ph['valuation_share'], '.0%')}; {num(ph['rounds_per_hour_machine'], '.0f')} "
            f"rounds/h across the machine; GPU {gpu.get('util_mean', '?')}% (max "
            f"{gpu.get('mem_max_mib', '?')} MiB); {sum(r['rejected'] for r in runs)} rejected")


def _print_new(phase: Phase, pdir: Path, seen: dict[str, int]) -> None:
    for name in seen:
        rounds = read_rounds(pdir / name / "rounds.jsonl")
        for rec in rounds[seen[name]:]:
            print(round_line(phase.name, name, rec, phase.rounds), flush=True)
        seen[name] = len(rounds)


def _exit_on_term(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def machine() -> dict[str, Any]:
    """The machine the phases ran on: the benchmarks' description and the GPU torch sees."""
    import torch

    from benchmarks._common import machine_info

    info = machine_info()
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_mem_gib=round(props.total_memory / 2**30, 1),
                    cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
    else:
        info["gpu"] = None
    return info


def run_together(phases: tuple[Phase, ...], args: argparse.Namespace, runs_dir: Path,
                 end: float) -> None:
    """Every phase at once, each in a thread with the time left as its cap."""
    cap = end - args.reserve_s - time.time()
    threads = [threading.Thread(target=run_phase, args=(ph, args.profile, runs_dir,
                                                         args.data_dir, min(ph.cap_s, cap)))
               for ph in phases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    summary = write_summary(runs_dir, args.out)
    for ph in summary["phases"]:
        print(phase_line(ph), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", choices=sorted(PROFILES), default="gpu")
    p.add_argument("--data-dir", required=True, help="the decoded datasets' folder")
    p.add_argument("--work", type=Path, required=True, help="where the runs write (big files)")
    p.add_argument("--out", type=Path, required=True, help="summary files and records tarball")
    p.add_argument("--deadline-s", type=float, default=420.0,
                   help="seconds from now by which every phase has stopped")
    p.add_argument("--reserve-s", type=float, default=15.0,
                   help="kept after the last phase for the summary and the tarball")
    p.add_argument("--alone-rounds", type=int, default=0,
                   help="rounds of the two alone phases (0: the profile's)")
    args = p.parse_args(argv)
    end = time.time() + args.deadline_s
    # the shell's timeout sends SIGTERM: unwind through run_phase's finally, then summarise
    signal.signal(signal.SIGTERM, _exit_on_term)
    runs_dir = args.work / "runs"
    shutil.rmtree(runs_dir, ignore_errors=True)  # a warm machine keeps the call before's
    runs_dir.mkdir(parents=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (runs_dir / "profile.json").write_text(json.dumps(
        {"profile": args.profile, "run_config": {**COMMON, **PROFILES[args.profile]},
         "arms": ARMS, "num_supernodes": NUM_SUPERNODES, "deadline_s": args.deadline_s,
         "machine": machine()}, indent=1))
    sampler = GpuSampler(runs_dir / "gpu.csv")
    sampler.start()
    try:
        if args.profile in CONCURRENT:
            run_together(PHASES[args.profile], args, runs_dir, end)
        for phase in () if args.profile in CONCURRENT else PHASES[args.profile]:
            if args.alone_rounds and phase.name.startswith("alone-"):
                phase = replace(phase, rounds=args.alone_rounds)
            cap = min(phase.cap_s, end - args.reserve_s - time.time())
            if cap < MIN_CAP_S:
                print(f"[gpu-resnet18] {phase.name} skipped: {cap:.0f}s left", flush=True)
                continue
            sampler.phase = phase.name
            run_phase(phase, args.profile, runs_dir, args.data_dir, cap)
            sampler.phase = "between"
            summary = write_summary(runs_dir, args.out)
            print(phase_line(next(ph for ph in summary["phases"] if ph["name"] == phase.name)),
                  flush=True)
            pack_records(runs_dir, args.out / "records.tar.gz")
    finally:
        sampler.stop.set()
        write_summary(runs_dir, args.out)
        pack_records(runs_dir, args.out / "records.tar.gz")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
