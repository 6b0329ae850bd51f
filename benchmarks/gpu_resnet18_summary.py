r"""The numbers of :mod:`benchmarks.gpu_resnet18`'s phases, from the runs' own records.

From a runs folder (``phase.json`` and each run's ``rounds.jsonl`` in a folder per phase,
``gpu.csv``, ``profile.json``) it writes:

* ``summary.json``: per phase and run, the median seconds a round (``round_seconds``: selection,
  training, aggregation, not the evaluation; round 1 left out, it pays CUDA's and cuDNN's
  start), the median wall seconds a round (evaluation included), the valuation's median
  seconds and share of the rounds, rejected and failed replies, accuracy; the GPU's utilisation
  and memory per phase; and the checks a reader looks at first (``checks``);
* ``concurrency.csv``: one row per phase (runs at once, seconds a round, rounds an hour across
  the machine, the valuation's share);
* ``smoke-rounds.csv.gz``: the per-round rows of the two ``alone-*`` runs (the smoke run);
* ``smoke-accuracy.png``: their test accuracy per round.

Back on the host, from the call's ``records.tar.gz``::

    python -m benchmarks.gpu_resnet18_summary --records records.tar.gz \
        --out docs/results/gpu-resnet18
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import tarfile
import tempfile
from pathlib import Path
from typing import Any

#: What the records tarball leaves out: the models (ResNet-18's state is 45 MB a copy).
_BIG = (".npz", ".pt", ".png")


def _read_rounds(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines() if line]


def _median(xs: list[float]) -> float | None:
    return round(float(statistics.median(xs)), 4) if xs else None


def run_stats(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's numbers from its ``rounds.jsonl`` rows (round 1 left out of the timings
    when a later round exists)."""
    trained = [r for r in rounds if r.get("round")]
    timed = trained[1:] if len(trained) > 1 else trained
    secs = [float(r["round_seconds"]) for r in timed if r.get("round_seconds") is not None]
    vals = [float(r["valuation_seconds"]) for r in timed
            if r.get("valuation_seconds") is not None]
    # wall seconds a round, its evaluation included: the step of elapsed_seconds
    elapsed = {int(r["round"]): float(r["elapsed_seconds"]) for r in rounds
               if r.get("elapsed_seconds") is not None}
    walls = [elapsed[k] - elapsed[k - 1] for k in (int(r["round"]) for r in timed)
             if k in elapsed and k - 1 in elapsed]
    evaluated = [r for r in rounds if r.get("test_accuracy") is not None]
    return {
        "rounds_done": len(trained),
        "round_seconds_median": _median(secs),
        "round_seconds_max": round(max(secs), 3) if secs else None,
        "wall_seconds_median": _median(walls),
        "valuation_seconds_median": _median(vals),
        "valuation_share": round(sum(vals) / sum(secs), 4) if vals and sum(secs) > 0 else None,
        "rejected": sum(len(r.get("rejected") or {}) for r in trained),
        "failed": sum(len(r.get("failed") or {}) for r in trained),
        "rounds_all_rejected": sum(1 for r in trained if r.get("rejected")
                                   and len(r["rejected"]) >= len(r.get("returned") or [])),
        "initial_test_loss": evaluated[0].get("test_loss") if evaluated else None,
        "final_test_loss": evaluated[-1].get("test_loss") if evaluated else None,
        "final_test_accuracy": evaluated[-1].get("test_accuracy") if evaluated else None,
        "best_test_accuracy": max((float(r["test_accuracy"]) for r in evaluated), default=None),
    }


def gpu_by_phase(path: Path) -> dict[str, dict[str, float]]:
    """Mean and max utilisation (%) and max memory (MiB) per phase of ``gpu.csv``."""
    rows: dict[str, list[tuple[float, float]]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split(",")
            try:
                rows.setdefault(parts[1], []).append((float(parts[2]), float(parts[3])))
            except (IndexError, ValueError):
                continue
    return {phase: {"util_mean": round(statistics.fmean(u for u, _ in xs), 1),
                    "util_max": max(u for u, _ in xs), "mem_max_mib": max(m for _, m in xs),
                    "samples": len(xs)} for phase, xs in rows.items()}


def phase_summary(pdir: Path, gpu: dict[str, dict[str, float]]) -> dict[str, Any]:
    """A phase's record with its runs' numbers and the medians across them."""
    phase = json.loads((pdir / "phase.json").read_text())
    runs = {cfg.stem: {"seed": json.loads(cfg.read_text())["seed"],
                       **run_stats(_read_rounds(pdir / cfg.stem / "rounds.jsonl"))}
            for cfg in sorted(pdir.glob("s*.json"))}
    done = [r for r in runs.values() if r["rounds_done"]]

    def across(key: str) -> float | None:
        return _median([r[key] for r in done if r[key] is not None])

    wall = across("wall_seconds_median")
    return {**phase, "runs": runs, "gpu": gpu.get(phase["name"]),
            "round_seconds_median": across("round_seconds_median"),
            "wall_seconds_median": wall, "valuation_share": across("valuation_share"),
            "valuation_seconds_median": across("valuation_seconds_median"),
            "rounds_per_hour_machine": round(len(done) * 3600 / wall, 1) if wall else None}


def smoke_rows(runs_dir: Path) -> list[dict[str, Any]]:
    """The per-round rows of the ``alone-*`` phases' runs, the numbers a plot needs."""
    keys = ("test_accuracy", "test_loss", "val_accuracy", "round_seconds", "valuation_seconds",
            "elapsed_seconds")
    rows = []
    for pdir in sorted(runs_dir.glob("alone-*")):
        phase = json.loads((pdir / "phase.json").read_text())
        for rec in _read_rounds(pdir / f"s{phase['first_seed']}" / "rounds.jsonl"):
            rows.append({"arm": phase["arm"], "round": rec["round"],
                         **{k: (f"{float(rec[k]):.4f}" if rec.get(k) is not None else "")
                            for k in keys},
                         "returned": len(rec.get("returned") or []),
                         "rejected": len(rec.get("rejected") or {}),
                         "failed": len(rec.get("failed") or {})})
    return rows


def write_summary(runs_dir: Path, out: Path) -> dict[str, Any]:
    """Write ``summary.json``, ``concurrency.csv``, ``smoke-rounds.csv.gz`` and
    ``smoke-accuracy.png`` under ``out``; returns the summary."""
    from sim.compact import open_csv

    out.mkdir(parents=True, exist_ok=True)
    gpu = gpu_by_phase(runs_dir / "gpu.csv")
    phases = sorted((phase_summary(p.parent, gpu) for p in runs_dir.glob("*/phase.json")),
                    key=lambda ph: ph["started"])
    profile_file = runs_dir / "profile.json"
    profile = json.loads(profile_file.read_text()) if profile_file.exists() else {}
    runs = [r for ph in phases for r in ph["runs"].values()]
    alone = {ph["arm"]: ph["runs"] for ph in phases if ph["name"].startswith("alone-")}
    summary = {
        **profile, "gpu_setup": gpu.get("setup"), "phases": phases,
        "checks": {
            "no_rejected_replies": all(r["rejected"] == 0 for r in runs),
            "no_failed_replies": all(r["failed"] == 0 for r in runs),
            "smoke_rounds_done": {arm: [r["rounds_done"] for r in rs.values()]
                                  for arm, rs in alone.items()},
            "smoke_loss_fell": {arm: [r["final_test_loss"] is not None
                                      and r["final_test_loss"] < r["initial_test_loss"]
                                      for r in rs.values()] for arm, rs in alone.items()},
            "phases_cut": [ph["name"] for ph in phases if ph.get("cut")],
        },
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    cols = ("phase", "arm", "concurrency", "runs_with_rounds", "rounds_done",
            "round_seconds_median", "wall_seconds_median", "valuation_seconds_median",
            "valuation_share", "rounds_per_hour_machine", "gpu_util_mean", "gpu_mem_max_mib",
            "runs_cut")
    with (out / "concurrency.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for ph in phases:
            g = ph["gpu"] or {}
            w.writerow([ph["name"], ph["arm"], ph["jobs"],
                        sum(1 for r in ph["runs"].values() if r["rounds_done"]),
                        sum(r["rounds_done"] for r in ph["runs"].values()),
                        *(ph[k] for k in cols[5:10]), g.get("util_mean", ""),
                        g.get("mem_max_mib", ""), len(ph.get("cut") or [])])
    rows = smoke_rows(runs_dir)
    if rows:
        with open_csv(out / "smoke-rounds.csv.gz", "w") as fh:
            dw = csv.DictWriter(fh, fieldnames=list(rows[0]))
            dw.writeheader()
            dw.writerows(rows)
        plot_smoke(rows, out / "smoke-accuracy.png", profile)
    return summary


def plot_smoke(rows: list[dict[str, Any]], path: Path, profile: dict[str, Any]) -> None:
    """Test accuracy per round of the smoke run's arms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sim.compact import save_png

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for arm in dict.fromkeys(r["arm"] for r in rows):
        pts = [(r["round"], 100 * float(r["test_accuracy"])) for r in rows
               if r["arm"] == arm and r["test_accuracy"] != ""]
        ax.plot(*zip(*pts, strict=True), marker=".", label=arm)
    cfg = profile.get("run_config", {})
    ax.set(xlabel="round", ylabel="test accuracy (%)",
           title=f"{cfg.get('dataset', '?')} {cfg.get('model', '?')}, 10 of "
                 f"{profile.get('num_supernodes', '?')} clients a round, seed 0")
    ax.grid(alpha=0.3)
    ax.legend()
    save_png(fig, path)
    plt.close(fig)


def pack_records(runs_dir: Path, tar_path: Path) -> None:
    """``runs_dir`` (as ``runs/``) without the models and plots, as one tarball (written whole, then
    renamed, so a call cut while packing keeps the last complete one)."""
    tmp = tar_path.with_suffix(".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(runs_dir, arcname="runs",
                filter=lambda ti: None if ti.name.endswith(_BIG) else ti)
    tmp.replace(tar_path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--records", type=Path, help="a call's records.tar.gz")
    src.add_argument("--runs", type=Path, help="a runs folder")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--pack", type=Path, help="also pack the runs folder's records here")
    args = p.parse_args(argv)
    if args.runs:
        summary = write_summary(args.runs, args.out)
        if args.pack:
            pack_records(args.runs, args.pack)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            with tarfile.open(args.records) as tar:
                tar.extractall(tmp, filter="data")
            summary = write_summary(Path(tmp) / "runs", args.out)
    print(json.dumps(summary["checks"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
