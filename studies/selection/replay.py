"""Replay a preset's archived cells at this checkout, round by round (issue 73).

For one variant and seed, one finished cell per setting (the seed asked for, else the lowest
finished seed) is read from the preset's committed archive (its ``cells-manifest.json`` names
each cell's part), run again at this checkout for its first ``--rounds`` rounds with its exact
run config (the runner's inline backend: a child process, the runner's environment), and
compared with the archived run's rounds: the selected clients, the aggregation weights (largest
absolute difference), phi, and the validation and test accuracy. A run config whose
``hics-rounds`` resolves to the run's length (0) gets the archived run's length, so the
annealing, and with it the draws, can match. Written to ``--out`` (a CSV, a row per setting and
round) and beside it a page of the same name ending ``.md`` (a sentence per setting; its section
from ``## Reading`` on, written by hand, is kept when the page is written again). Replayed
runs stay in ``--work``; one already finished there is read, not run again:

    python -m studies.selection.replay conf/selection-peers-dev.toml --variant hics-phi \\
        --seed 0 --rounds 20 --work /tmp/replay-hics-phi \\
        --out docs/results/selection-peers-dev/replay-hics-phi.csv

A replay that differs from the archive may differ by the code or by the machine (another CPU's
kernels grow other last bits). ``--pin-work DIR`` tells them apart: ``DIR/<cell id>`` holds the
same run config run at the archived cell's commit on this machine, each made from the replay's
own config (in a worktree at that commit, ``git worktree add /tmp/pin <commit>``):

    cd /tmp/pin && PYTHONPATH=. OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python -m sim.inline \\
        --run-config CONFIG --num-supernodes 100

with CONFIG a copy of ``<work>/<cell id>/inline-run-config.json`` whose ``output-dir`` is
``DIR/<cell id>``; the CSV's ``pin_equal`` then says whether the replay's round equals that
run's in every field (wall-clock seconds and the selector's cost fields, whose names changed,
left out).
"""

from __future__ import annotations

import argparse
import json
import math
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.archives import MANIFEST
from sim.cell_state import SUMMARY_FILE, code_state, cpu_model
from sim.grid import Cell, Preset
from sim.inline import COMPLETED, inline_run
from sim.presets import load_preset
from sim.results import config_drift
from studies.selection.cells import setting_key, write_csv

REPO = Path(__file__).resolve().parents[2]
#: Where the page's hand-written reading begins (kept when the page is written again).
READING = "## Reading"


@dataclass(frozen=True)
class Archived:
    """One archived cell: its recorded config (``config.json``), code record and rounds."""

    cell: Cell
    config: dict[str, Any]
    code: list[dict[str, Any]]
    rounds: list[dict[str, Any]]


def manifest_path(preset: Preset) -> Path:
    """The committed manifest of ``preset``'s archive."""
    return REPO / "docs" / "results" / preset.name / MANIFEST


def pick_cells(preset: Preset, manifest: dict[str, Any], variant: str, seed: int
               ) -> list[tuple[Cell, int]]:
    """One archived cell of ``variant`` per setting, in the preset's order, with its part:
    seed ``seed`` where it is archived, else the lowest archived seed."""
    parts = {c["cell"]: int(c["part"]) for c in manifest["cells"]}
    chosen: dict[str, Cell] = {}
    for cell in preset.cells():
        if cell.point.get("variant") != variant or cell.cell_id not in parts:
            continue
        key = setting_key(cell)
        best = chosen.get(key)
        rank = (cell.config.seed != seed, cell.config.seed)
        if best is None or rank < (best.config.seed != seed, best.config.seed):
            chosen[key] = cell
    if not chosen:
        raise SystemExit(f"no archived cell of variant {variant!r} in {preset.name}: "
                         f"pick one of {sorted(preset.variants)}")
    order = [setting_key(c) for c in preset.cells()]
    return [(chosen[k], parts[chosen[k].cell_id]) for k in sorted(chosen, key=order.index)]


def read_archived(cell: Cell, part: Path) -> Archived:
    """``cell``'s config, code record and rounds from the archive part ``part``."""
    files: dict[str, bytes] = {}
    with tarfile.open(part, "r:*") as tar:
        for name in ("config.json", "code.json", "rounds.jsonl"):
            handle = tar.extractfile(f"{cell.cell_id}/{name}")
            if handle is None:
                raise SystemExit(f"{part}: no {cell.cell_id}/{name}; restore the archive again")
            files[name] = handle.read()
    rounds = [json.loads(line) for line in files["rounds.jsonl"].decode().splitlines() if line]
    return Archived(cell, json.loads(files["config.json"]), json.loads(files["code.json"]),
                    rounds)


def replay_config(archived: Archived, rounds: int, out: Path) -> dict[str, Any]:
    """The cell's run config for a replay of its first ``rounds`` rounds into ``out``; a
    ``hics-rounds`` that resolves to the run's length (0) pinned to the archived run's."""
    cfg = {**archived.cell.run_config, "num-server-rounds": rounds, "output-dir": str(out)}
    if archived.cell.config.hics_rounds == 0:
        recorded = int(archived.config.get("hics_rounds", 0))
        cfg["hics-rounds"] = recorded or int(archived.config["num_server_rounds"])
    return cfg


def replay(archived: Archived, rounds: int, work: Path, timeout: float,
           num_supernodes: int) -> list[dict[str, Any]]:
    """The replayed rounds of ``archived`` (run into ``work/<cell id>`` unless finished
    there)."""
    out = work / archived.cell.cell_id
    if not (out / SUMMARY_FILE).exists():
        outcome = inline_run(None, replay_config(archived, rounds, out),
                             num_supernodes=num_supernodes, timeout=timeout)
        if outcome.status != COMPLETED:
            raise SystemExit(f"replay of {archived.cell.cell_id} {outcome.status}:\n"
                             f"{outcome.output[-3000:]}")
    return read_rounds(out)


#: Round-record fields a replay may differ in without differing in behaviour: wall-clock times and
#: the selection record's cost fields (renamed at 67b7d89).
UNTIMED = frozenset({"round_seconds", "elapsed_seconds", "valuation_seconds"})
COST_FIELDS = frozenset({"server_seconds", "selector_seconds", "extra_messages"})


def behaviour(record: dict[str, Any]) -> dict[str, Any]:
    """A round record less its wall-clock times and its selection record's cost fields."""
    kept = {k: v for k, v in record.items() if k not in UNTIMED}
    if isinstance(kept.get("selection"), dict):
        kept["selection"] = {k: v for k, v in kept["selection"].items() if k not in COST_FIELDS}
    return kept


def read_rounds(out: Path) -> list[dict[str, Any]]:
    """The round records of the run in ``out``."""
    return [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines() if line]


def largest_gap(a: dict[str, float] | None, b: dict[str, float] | None) -> float:
    """The largest absolute difference of two per-client maps (a client missing in one: its
    whole value); nan when either is absent."""
    if a is None or b is None:
        return math.nan
    return max((abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b)), default=0.0)


def compare(setting: str, cell_id: str, archived: list[dict[str, Any]],
            replayed: list[dict[str, Any]], rounds: int,
            pinned: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """A row per round 1..``rounds``: selections equal, largest weight and phi differences,
    validation and test accuracy archived and replayed; with ``pinned`` (the same config run
    at the archived commit here), whether the replay's round equals its in :func:`behaviour`
    (``pin_equal``; '' without)."""
    old = {r["round"]: r for r in archived}
    new = {r["round"]: r for r in replayed}
    pin = {r["round"]: r for r in pinned or []}
    rows = []
    for t in range(1, rounds + 1):
        a, b = old.get(t), new.get(t)
        if a is None or b is None:
            raise SystemExit(f"{cell_id}: round {t} missing from the "
                             f"{'archive' if a is None else 'replay'}")
        rows.append({"setting": setting, "cell": cell_id, "round": t,
                     "selected_equal": a.get("selected") == b.get("selected"),
                     "weights_max_diff": largest_gap(a.get("weights"), b.get("weights")),
                     "phi_max_diff": largest_gap(a.get("phi"), b.get("phi")),
                     "val_archived": a["val_accuracy"], "val_replay": b["val_accuracy"],
                     "test_archived": a["test_accuracy"], "test_replay": b["test_accuracy"],
                     "pin_equal": "" if pinned is None else
                     (t in pin and behaviour(pin[t]) == behaviour(b))})
    return rows


def gaps(rows: list[dict[str, Any]]) -> str:
    """The largest weight, val and test accuracy differences over ``rows`` (accuracy in
    points)."""
    if not rows:
        return "none"
    val = max(abs(r["val_replay"] - r["val_archived"]) for r in rows)
    test = max(abs(r["test_replay"] - r["test_archived"]) for r in rows)
    weight = max(r["weights_max_diff"] for r in rows)
    return f"weights {weight:.1e}, val {100 * val:.2f} and test {100 * test:.2f} points"


def sentence(setting: str, archived: Archived, rows: list[dict[str, Any]],
             drift: dict[str, tuple[Any, Any]]) -> str:
    """What the replay of one setting's cell found, in one sentence."""
    equal = sum(r["selected_equal"] for r in rows)
    first = next((r["round"] for r in rows if not r["selected_equal"]), None)
    commits = ", ".join(sorted({c["commit"][:7] for c in archived.code}))
    moved = "; ".join(f"{k} {a!r} -> {b!r}" for k, a, b in
                      ((k, *v) for k, v in sorted(drift.items()))) or "none"
    where = "" if first is None else f" (first difference at round {first})"
    before = [] if first is None else [r for r in rows if r["round"] < first]
    pinned = [r["pin_equal"] for r in rows if r["pin_equal"] != ""]
    at_pin = (f"; at {commits} on this machine the same config ran {sum(pinned)} of "
              f"{len(pinned)} rounds identically to the replay" if pinned else "")
    return (f"- **{setting}** (cell {archived.cell.cell_id}, seed {archived.cell.config.seed}, "
            f"archived at {commits}): selections equal in {equal} of {len(rows)} rounds{where}; "
            f"largest differences from the archive in rounds 1-3: {gaps(rows[:3])}"
            + (f"; before round {first}: {gaps(before)}" if before else "")
            + f"; over all {len(rows)}: {gaps(rows)}{at_pin}; settings that resolve otherwise "
            f"now: {moved}.")


def csv_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` for the CSV: differences in exponent form, accuracies as fractions."""
    fmt = {"weights_max_diff": "{:.2e}", "phi_max_diff": "{:.2e}"}
    return [{k: fmt[k].format(v) if k in fmt else (f"{v:.6f}" if isinstance(v, float) else v)
             for k, v in r.items()} for r in rows]


def replay_each(preset: Preset, picked: list[tuple[Cell, int]], rounds: int, work: Path,
                pin_work: Path | None) -> tuple[list[dict[str, Any]], list[str]]:
    """Each picked cell (with its archive part) replayed and compared: the CSV's rows and the
    page's sentences."""
    rows, sentences = [], []
    for cell, part in picked:
        archived = read_archived(cell, REPO / "archives" / preset.name
                                 / f"cells-part{part:02d}.tar.xz")
        replayed = replay(archived, rounds, work, preset.cell_timeout, preset.num_supernodes)
        pin_dir = None if pin_work is None else pin_work / cell.cell_id
        pinned = read_rounds(pin_dir) if pin_dir and (pin_dir / SUMMARY_FILE).exists() else None
        setting = setting_key(cell)
        found = compare(setting, cell.cell_id, archived.rounds, replayed, rounds, pinned)
        rows += found
        sentences.append(sentence(setting, archived, found, config_drift(cell, archived.config)))
        print(sentences[-1], flush=True)
    return rows, sentences


def write_page(path: Path, head: str, sentences: list[str]) -> None:
    """The page: ``head``, a sentence per setting, and the page's hand-written section from
    :data:`READING` on, kept from the page as it was."""
    old = path.read_text() if path.exists() else ""
    reading = old[old.index(READING):] if READING in old else ""
    path.write_text(head + "\n".join(sentences) + "\n" + ("\n" + reading if reading else ""))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("preset", type=Path, help="the preset file, e.g. conf/selection-peers-dev.toml")
    p.add_argument("--variant", required=True, help="the variant to replay, e.g. hics-phi")
    p.add_argument("--seed", type=int, default=0, help="the seed to take where archived")
    p.add_argument("--rounds", type=int, default=20, help="rounds to replay and compare")
    p.add_argument("--work", type=Path, required=True, help="folder for the replayed runs")
    p.add_argument("--out", type=Path, required=True, help="the CSV (the page beside it)")
    p.add_argument("--pin-work", type=Path, default=None,
                   help="folder of the same configs run at the archived commit (docstring)")
    p.add_argument("--settings", nargs="*", default=None,
                   help="only these settings (as the page names them), in this order")
    args = p.parse_args(argv)
    if args.rounds < 1:
        raise SystemExit(f"--rounds {args.rounds}: replay at least one round")
    preset = load_preset(args.preset)
    picked = pick_cells(preset, json.loads(manifest_path(preset).read_text()), args.variant,
                        args.seed)
    if args.settings is not None:
        by_key = {setting_key(c): (c, part) for c, part in picked}
        unknown = [s for s in args.settings if s not in by_key]
        if unknown:
            raise SystemExit(f"--settings {unknown}: not among {list(by_key)}")
        picked = [by_key[s] for s in args.settings]
    rows, sentences = replay_each(preset, picked, args.rounds, args.work, args.pin_work)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_csv(args.out, csv_rows(rows))
    code = code_state()
    head = (f"# {preset.name}: {args.variant} replayed at {str(code.get('commit'))[:7]}"
            f"{' (dirty)' if code.get('dirty') else ''}\n\n"
            f"The first {args.rounds} rounds of one archived `{args.variant}` cell per setting "
            f"(seed {args.seed} where archived) run again at this checkout ({cpu_model()}) and "
            f"compared round by round with the archive: `{args.out.name}`. Command: the "
            f"docstring of `studies/selection/replay.py`.\n\n")
    write_page(args.out.with_suffix(".md"), head, sentences)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
