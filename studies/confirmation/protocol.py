"""The confirmations' fixed points: their seeds, preset prefixes and the protocol's arms.

A protocol names every arm x setting by the hash of its full resolved run config
(``docs/<study>/arms.json``, written by ``python -m studies.confirmation.pages arms``); every cell
records its config and the commit it ran, and :func:`check_cells` compares the two
(:func:`check_presets`: over the cells of a results folder, or those a fresh clone holds).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sim.cell_state import CODE_FILE
from sim.grid import Grid, Preset, expand_grid, pin_auto_selection
from sim.results import point_label

#: Seeds of the baselines' tuning and of the confirmation itself; no earlier result used either
#: (tests/test_protocol.py checks every committed archive and preset).
TUNING_SEEDS = (50, 51)
CONFIRMATION_SEEDS = tuple(range(100, 108))
#: The presets (conf/confirm/<dataset>.toml) and report folders of the confirmation.
PRESET_PREFIX = "confirm-"
#: The second confirmation's (issue 46): seeds no committed result or preset used before it,
#: its presets (conf/confirm2/<dataset>.toml, tuning on TUNING_SEEDS) and report folders.
SECOND_CONFIRMATION_SEEDS = tuple(range(200, 208))
SECOND_PRESET_PREFIX = "confirm2-"


#: The grid that holds the confirmation cells (an ``ablation`` grid with reference ``fedowen`` in
#: every conf/confirm*/<dataset>.toml).
CONFIRM_GRID = "confirm"

#: Per-run keys that differ between the seeds and machines of one arm by design.
#: Keys left out of an arm's hash: the per-run ones, and max-stalled-rounds (when a run that
#: learns nothing stops; a cell that finished learned the same at any value).
_PER_RUN = ("seed", "output_dir", "data_dir", "resume_from", "max_stalled_rounds")
#: Keys issue 72 added (DBA, Neurotoxin; AlignIns, MultiMetrics, FLAME, BackdoorIndicator; the
#: exclusion after a resolved negative contribution; what the adaptive backdoor knows), at their
#: defaults: both protocols predate them.
ISSUE72_KEYS: dict[str, Any] = {
    "adversary_dba_parts": 4, "adversary_dba_gap": 2, "adversary_neurotoxin_top": 0.05,
    "alignins_sparsity": 0.3, "alignins_lambda_s": 1.0, "alignins_lambda_c": 1.0,
    "multi_metrics_keep": 0.3, "flame_lambda": 0.001, "indicator_threshold": 0.95,
    "indicator_epochs": 200, "indicator_lr": 0.005, "indicator_mu": 0.4,
    "indicator_ood": "auto", "indicator_samples": 800, "exclusion_level": 0.0,
    "exclusion_min_rounds": 2, "adversary_knows": "bounds"}
#: Keys the app gained after the protocol commit (839845a), with the value that runs as the
#: code did before them: a config without them (a cell's config.json written then, or a
#: preset that leaves them to the defaults, which have changed since) ran at that value, and
#: at that value they are left out of an arm's resolved config, so the protocol's hashes keep
#: naming the same runs. A key no arm of the study reads takes today's default (hics_rounds:
#: 0 since e5da05e), so a run today names the same arm.
ADDED_AFTER_PROTOCOL = {"value_cap_multiple": 0.0, "value_cap_mode": "at-most", "link_memory": 0,
                        "poc_d": 20, "oort_exploration_min": 0.3, "selection_reward": "rank",
                        "selection_level": 0.01, "selection_cap": 0.0,
                        "adversary_trigger": "square", "adversary_trigger_size": 3,
                        "adversary_trigger_position": "bottom-right", "adversary_target": 0,
                        "adversary_poison_fraction": 0.5, "update_filter": "none",
                        "robust_lr_threshold": 0, "aggregate_noise": 0.0, "valuation_workers": 1,
                        "eval_every": 1, "greedyfed_memory": "mean",
                        "delta_estimator": "unbiased", "delta_floor": 0.05,
                        "delta_sigma_weight": 1.0, "delta_phi_floor": 0.5,
                        "delta_score": "paper", "delta_draw": "with-replacement",
                        "hics_temperature": 0.03, "hics_lambda": 10.0, "hics_gamma": 4.0,
                        "hics_clusters": 0, "hics_rounds": 0, "hics_switch": 0.0,
                        "statistics_cap": 0.0, "statistics_rule": "median",
                        "adversary_statistics_scale": 4.0, "defences": "auto",
                        **ISSUE72_KEYS}
#: The same for the second confirmation's protocol commit: its presets leave keys to the
#: defaults of that commit (direction-only valuation among them), so only the keys the app
#: gained after it are filled in.
ADDED_AFTER_SECOND_PROTOCOL: dict[str, Any] = {
    "greedyfed_memory": "mean", "delta_estimator": "unbiased", "delta_floor": 0.05,
    "delta_sigma_weight": 1.0, "delta_phi_floor": 0.5, "delta_score": "paper",
    "delta_draw": "with-replacement", "hics_temperature": 0.03, "hics_lambda": 10.0,
    "hics_gamma": 4.0, "hics_clusters": 0, "hics_rounds": 0, "hics_switch": 0.0,
    "statistics_cap": 0.0, "statistics_rule": "median", "adversary_statistics_scale": 4.0,
    "defences": "auto", **ISSUE72_KEYS}


def added_after(preset_name: str) -> dict[str, Any]:
    """The keys added after the protocol commit of the study that ``preset_name`` belongs
    to (a ``confirm2-`` preset: the second's; any other: the first's)."""
    if preset_name.startswith(SECOND_PRESET_PREFIX):
        return ADDED_AFTER_SECOND_PROTOCOL
    return ADDED_AFTER_PROTOCOL


def resolved_arm(config: dict[str, Any],
                 added: dict[str, Any] = ADDED_AFTER_PROTOCOL) -> dict[str, Any]:
    """The full run config an arm runs with, as the ServerApp resolves it (every key, the
    defaults included; ``auto`` selection, aggregation, norm cap and identity cap resolved),
    less the per-run keys. ``config`` is a run config (kebab-case) or a cell's config.json;
    ``added``: the keys the app gained after the study's protocol commit (:func:`added_after`),
    filled in where ``config`` lacks them and left out at that value."""
    from server_app.config import parse_run_config

    given = {k.replace("-", "_"): v for k, v in config.items()}
    cfg = parse_run_config({k.replace("_", "-"): v
                            for k, v in {**added, **given}.items()
                            if k not in _PER_RUN})
    choices = cfg.choices()
    resolved = {k: v for k, v in {**asdict(cfg), "selection_cap": choices.cap}.items()
                if k not in _PER_RUN and not (k in added and added[k] == v)}
    return {**resolved, "selection": choices.selection, "aggregation": choices.aggregation,
            "norm_cap": choices.norm_cap}


def config_hash(config: dict[str, Any], added: dict[str, Any] = ADDED_AFTER_PROTOCOL) -> str:
    """12 hex digits of the SHA-256 of :func:`resolved_arm`: one per arm and setting, the
    same in the protocol and in every cell that ran it."""
    text = json.dumps(resolved_arm(config, added), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _setting(grid: Grid, cell: Any) -> str:
    """The cell's column label, exactly as the ablation report's rounds CSV writes it (the
    report's hypotheses are keyed by that label)."""
    return point_label({k: cell.point[k] for k in grid.column_keys})


def protocol_arms(preset: Preset) -> list[dict[str, Any]]:
    """Every arm x setting of the preset's ``confirm`` grid: its hash, seeds and full
    resolved run config (docs/confirmation/arms.json)."""
    grid = preset.grid(CONFIRM_GRID)
    added = added_after(preset.name)
    arms: dict[tuple[str, str], dict[str, Any]] = {}
    for cell in expand_grid(preset, grid):
        setting = _setting(grid, cell)
        entry = arms.setdefault((str(cell.point[grid.rows]), setting), {
            "preset": preset.name, "arm": str(cell.point[grid.rows]), "setting": setting,
            "hash": config_hash(cell.run_config, added), "seeds": [],
            "num_supernodes": preset.num_supernodes,
            "run_config": resolved_arm(cell.run_config, added)})
        entry["seeds"].append(cell.config.seed)
        if config_hash(cell.run_config, added) != entry["hash"]:
            raise ValueError(f"{preset.name}: arm {entry['arm']} at {setting} differs between "
                             "seeds in more than the seed")
    return list(arms.values())


def check_cells(arms: list[dict[str, Any]], preset: Preset, results: Path) -> list[str]:
    """What is wrong with the confirmation cells under ``results``: a cell whose recorded
    config (config.json) hashes otherwise than its arm in the protocol, or that ran from a
    checkout with uncommitted changes (code.json). A cell carried from the committed rows
    (``sim.carry``) is checked when the report's records archive gave it both files; one
    without them is not: :func:`main` counts those."""
    expected = {(a["arm"], a["setting"]): a["hash"] for a in arms if a["preset"] == preset.name}
    grid = preset.grid(CONFIRM_GRID)
    problems = []
    for cell in expand_grid(preset, grid):
        setting = _setting(grid, cell)
        recorded = results / cell.cell_id / "config.json"
        if not recorded.exists():
            continue
        arm = str(cell.point[grid.rows])
        got = config_hash(pin_auto_selection(json.loads(recorded.read_text()),
                                             preset.auto_selection), added_after(preset.name))
        if got != expected.get((arm, setting)):
            problems.append(f"{cell.cell_id} ({arm}, {setting}, seed "
                            f"{cell.run_config.get('seed')}): config hash {got}, protocol "
                            f"{expected.get((arm, setting))}")
        code = results / cell.cell_id / CODE_FILE
        for attempt in json.loads(code.read_text()) if code.exists() else []:
            if attempt.get("dirty"):
                problems.append(f"{cell.cell_id}: attempt {attempt['attempt']} ran on "
                                f"{attempt.get('commit')} with uncommitted changes")
    return problems


def check_presets(presets: list[Any], arms: list[dict[str, Any]], root: Path,
                  results: Path | None, committed: bool) -> tuple[list[str], dict[str, int]]:
    """:func:`check_cells` over each preset's confirmation cells: those under
    ``results`` (default ``results/<preset>``), or with ``committed`` those a fresh clone
    holds (``archives/<preset>/`` restored and ``docs/results/<preset>/``'s rows carried into
    a temporary folder); and how many cells were checked, carried without records, absent."""
    from sim.archives import restore_cells
    from sim.carry import carry_rows, is_carried

    bad: list[str] = []
    counts = {"checked": 0, "carried": 0, "absent": 0}
    for preset in presets:
        with contextlib.ExitStack() as stack:
            cells = results or root / "results" / preset.name
            if committed:
                cells = Path(stack.enter_context(tempfile.TemporaryDirectory()))
                if (root / "archives" / preset.name).is_dir():
                    restore_cells(root / "archives" / preset.name, cells)
                if (root / "docs" / "results" / preset.name).is_dir():
                    carry_rows(preset, root / "docs" / "results" / preset.name, cells)
            bad += check_cells(arms, preset, cells)
            for cell in expand_grid(preset, preset.grid(CONFIRM_GRID)):
                found = cells / cell.cell_id
                counts["checked" if (found / "config.json").exists() else
                       "carried" if is_carried(found) else "absent"] += 1
    return bad, counts
