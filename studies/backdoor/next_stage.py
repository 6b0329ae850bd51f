"""The presets after backdoor-defaults-dev's reading (issue 72, deliver 5): stage 2 and the
fresh seeds, written from stage 1's preset so that they copy its settings, attacks and arms
rather than re-typing them.

**Stage 2** (the rule's step 4): the pick and ``fedowen`` at 10% attackers, in stage 1's
settings, attacks and attacked seeds; no clean cells (the clean cost is stage 1's). Where
``fedowen`` says ``defences = "auto"``, it is pinned to the list ``auto`` resolves to when the
preset is written, so that the preset keeps meaning stage 1's defaults once a pick is adopted.
A pick that fails there gives way to the next arm of step 3's order (decision.md): write stage
2 again with that arm. ::

    python -m studies.backdoor.next_stage stage2 conf/backdoor-defaults-dev.toml --arm PICK \\
        --out conf/backdoor-defaults-dev-10.toml

Where stage 1 picks no arm there is no stage 2, and ``fresh --arm none`` (no ``--stage2``)
writes the fresh seeds for the app's defaults alone (:func:`fresh_defaults`).

**The fresh seeds** (the acceptance's second point), once the pick is adopted: ``adopted`` (no
key pinned: the app's defaults at the commit the cells run at, which must resolve to the pick's
keys: checked here, naming each key that does not) and ``fedowen`` (stage 2's pinned copy of
stage 1's defaults, the reference) in stage 1's attacks at its fraction and clean, on seeds no
preset under conf/ names, and its adaptive attack again knowing the defence list
(``adaptive-knows``: :func:`knowing`). ::

    python -m studies.backdoor.next_stage fresh conf/backdoor-defaults-dev.toml \\
        --stage2 conf/backdoor-defaults-dev-10.toml --arm PICK --seeds 70 71 72 \\
        --clean-seeds 70 71 72 73 74 --out conf/backdoor-defaults-fresh.toml

Both read the same way as stage 1 (``python -m studies.backdoor.defaults_rule``); stage 2 of a
pick that stage 1's decision.md shows as not holding (step 3's fallback) with ``--stage-1
fallback``.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tomli_w

from fedowen_strategy.defences.table import resolve
from fedowen_strategy.round.contribution import resolve_auto
from server_app.keys import defaults
from studies.backdoor.defaults_rule import REFERENCE, STAGE_2

Raw = dict[str, Any]


def load(path: Path) -> Raw:
    return tomllib.loads(path.read_text())


def attacked(grid: Mapping[str, Any], base: Mapping[str, Any]) -> bool:
    return float(grid.get("set", {}).get("adversary-fraction",
                                         base.get("adversary-fraction", 0.0))) > 0


def variant(raw: Raw, arm: str, where: Path | str) -> dict[str, Any]:
    found = raw.get("variants", {}).get(arm)
    if found is None:
        raise SystemExit(f"--arm {arm!r} is not a variant of {where}: its variants are "
                         f"{', '.join(raw.get('variants', {}))}")
    return dict(found)


def pinned(keys: Mapping[str, Any]) -> dict[str, Any]:
    """``keys`` with ``defences = "auto"`` replaced by the list it resolves to now."""
    out = dict(keys)
    if str(out.get("defences", "auto")).strip() == "auto":
        out["defences"] = " ".join(resolve("auto", fedowen=True))
    return out


def stage2(raw: Raw, arm: str, fraction: float = 0.1, where: str = "stage 1") -> Raw:
    """Stage 1's preset cut to its attacked grids at ``fraction`` attackers, ``fedowen``
    (pinned) and ``arm``."""
    if arm == REFERENCE:
        raise SystemExit(f"--arm {arm!r} is the reference: name the pick of decision.md")
    out = copy.deepcopy(raw)
    per_round = int(raw["base"].get("clients-per-round", 10))
    out["preset"]["name"] = f"{raw['preset']['name']}-{round(100 * fraction)}"
    out["preset"]["description"] = (
        f"Stage 2 of {raw['preset']['name']}: {arm} and the defaults (fedowen, pinned) at "
        f"{100 * fraction:g}% attackers, stage 1's settings, attacks and attacked seeds")
    out["variants"] = {REFERENCE: pinned(variant(raw, REFERENCE, where)),
                       arm: variant(raw, arm, where)}
    out["grid"] = []
    for grid in raw["grid"]:
        if not attacked(grid, raw["base"]):
            continue
        grid = copy.deepcopy(grid)
        grid["set"] = {**grid["set"], "adversary-fraction": fraction,
                       "krum-malicious": max(1, round(fraction * per_round))}
        grid["axes"] = {**grid["axes"], "variant": [REFERENCE, arm]}
        grid["description"] = f"{100 * fraction:g}% attackers; " + grid.get("description", "")
        out["grid"].append(grid)
    return out


def used_seeds(conf: Path, skip: Path | None = None) -> set[int]:
    """Every seed a preset under ``conf`` names (a ``seed`` key, or a list of them, anywhere)."""
    seen: set[int] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "seed":
                    seen.update(int(s) for s in (v if isinstance(v, list) else [v]))
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for path in sorted(conf.rglob("*.toml")):
        if skip is None or path.resolve() != skip.resolve():
            walk(load(path))
    return seen


def adoption_gaps(keys: Mapping[str, Any], app: Mapping[str, Any] | None = None) -> list[str]:
    """Each of ``keys`` (the pick's run-config keys) the app's defaults do not resolve to:
    ``defences`` and the strategy's ``auto`` keys compared as the strategy resolves them."""
    app = defaults() if app is None else app
    method = str(keys.get("valuation", app["valuation"]))

    def resolved(cfg: Mapping[str, Any]) -> dict[str, Any]:
        choices = resolve_auto(method, str(cfg["selection"]), str(cfg["aggregation"]),
                               str(cfg["norm-cap"]), float(cfg["selection-cap"]))
        return {"selection": choices.selection, "aggregation": choices.aggregation,
                "norm-cap": choices.norm_cap, "selection-cap": choices.cap,
                "defences": " ".join(resolve(str(cfg["defences"]), fedowen=True))}

    theirs, ours = resolved({**app, **keys}), resolved(app)
    gaps = []
    for key, value in keys.items():
        if key not in app:
            gaps.append(f"{key}: not a run-config key (docs/keys.md)")
            continue
        want, have = (theirs[key], ours[key]) if key in theirs else (value, app[key])
        if want != have:
            gaps.append(f"{key}: the pick has {want!r}, the app's default is {have!r}")
    return gaps


def fresh(raw: Raw, raw2: Raw, arm: str, seeds: Sequence[int], clean_seeds: Sequence[int],
          used: Iterable[int], app: Mapping[str, Any] | None = None) -> Raw:
    """Stage 1's grids on fresh seeds: ``adopted`` (the app's defaults) and ``fedowen`` (stage
    2's pinned defaults). Stops when a seed was used or the defaults are not the pick's."""
    refuse_used(seeds, clean_seeds, used)
    if gaps := adoption_gaps(variant(raw, arm, "stage 1"), app):
        raise SystemExit(f"the app's defaults are not {arm!r} yet; adopt it first:\n  "
                         + "\n  ".join(gaps))
    reference = variant(raw2, REFERENCE, "stage 2")
    if str(reference.get("defences", "auto")).strip() == "auto":
        raise SystemExit("stage 2's fedowen leaves defences at auto: write stage 2 with "
                         "python -m studies.backdoor.next_stage stage2 (which pins it)")
    return on_fresh_seeds(raw, {REFERENCE: reference, "adopted": {}}, seeds, clean_seeds,
                          f"The adopted defaults ({arm}) and stage 1's (fedowen, pinned)",
                          "settings and attacks")


def refuse_used(seeds: Sequence[int], clean_seeds: Sequence[int], used: Iterable[int]) -> None:
    """Stops when a fresh seed is one a preset under conf/ names already."""
    reused = sorted((set(seeds) | set(clean_seeds)) & set(used))
    if reused:
        raise SystemExit(f"seeds {reused} are named by presets under conf/: fresh seeds must be "
                         "new (pick others)")


def on_fresh_seeds(raw: Raw, variants: dict[str, Any], seeds: Sequence[int],
                   clean_seeds: Sequence[int], who: str, what: str) -> Raw:
    """Stage 1's preset with ``variants`` (the first its grids' reference) on ``seeds``
    (attacked grids) and ``clean_seeds`` (clean ones), plus :func:`knowing`'s grids."""
    out = copy.deepcopy(raw)
    out["preset"]["name"] = f"{raw['preset']['name'].removesuffix('-dev')}-fresh"
    out["preset"]["description"] = (
        f"{who} on fresh seeds {list(seeds)} (attacked) and {list(clean_seeds)} (clean), "
        f"{raw['preset']['name']}'s {what}")
    out["variants"] = variants
    for grid in out["grid"]:
        hit = attacked(grid, raw["base"])
        grid["axes"] = {**grid["axes"], "seed": list(seeds if hit else clean_seeds),
                        "variant": list(variants)}
        grid["reference"] = next(iter(variants))
    out["grid"] += knowing(out["grid"])
    return out


#: ``--arm`` when stage 1 picked nothing (decision.md's "Pick: none"): the defaults keep no
#: backdoor defence, stage 2 has nothing to check, and the fresh seeds measure the defaults.
NO_PICK = "none"


def fresh_defaults(raw: Raw, seeds: Sequence[int], clean_seeds: Sequence[int],
                   used: Iterable[int], app: Mapping[str, Any] | None = None) -> Raw:
    """Stage 1's grids on fresh seeds for the app's defaults alone (``adopted``, no key
    pinned), when stage 1 picked no arm: nothing was adopted, so their clean cost is 0 by
    construction and the cells measure what the defaults let through. Stops when a seed was
    used or the app's defaults no longer resolve to stage 1's ``fedowen``."""
    refuse_used(seeds, clean_seeds, used)
    if gaps := adoption_gaps(variant(raw, REFERENCE, "stage 1"), app):
        raise SystemExit(f"the app's defaults are no longer stage 1's {REFERENCE!r}:\n  "
                         + "\n  ".join(gaps))
    return on_fresh_seeds(raw, {"adopted": {}}, seeds, clean_seeds,
                          "The defaults (no backdoor defence adopted: stage 1 picked none)",
                          "settings and attacks, and its adaptive attack knowing the defence list")


def knowing(grids: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each ``adaptive-backdoor`` grid again as ``adaptive-knows-*``, its attacker knowing the
    run's defence list (``adversary-knows = "defences"``: docs/arena.md), which stage 1's
    ``adaptive`` did not (it knows the defaults' bounds): reported beside the rule's attacks."""
    out = []
    for grid in grids:
        if grid.get("set", {}).get("adversary-kind") == "adaptive-backdoor":
            again = copy.deepcopy(dict(grid))
            again["name"] = grid["name"].replace("adaptive-", "adaptive-knows-", 1)
            again["set"] = {**grid["set"], "adversary-knows": "defences"}
            again["description"] = ("its attacker knows the run's defence list; "
                                    + grid.get("description", ""))
            out.append(again)
    return out


def write(raw: Raw, out: Path, header: Sequence[str]) -> None:
    stamp = datetime.date.today().isoformat()
    lines = [f"# {raw['preset']['name']}: written by python -m studies.backdoor.next_stage on "
             f"{stamp}, before any of its cells ran.", *(f"# {h}" for h in header), ""]
    out.write_text("\n".join(lines) + tomli_w.dumps(raw))
    print(f"[next-stage] wrote {out}: {len(raw['grid'])} grids, arms "
          f"{', '.join(raw['variants'])}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("stage", choices=("stage2", "fresh"))
    p.add_argument("preset", type=Path, help="stage 1's preset (conf/backdoor-defaults-dev.toml)")
    p.add_argument("--arm", required=True, help="the pick (decision.md), or the next of step "
                   f"3; fresh: {NO_PICK!r} when stage 1 picked none")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--fraction", type=float, default=0.1, help="stage 2's attackers")
    p.add_argument("--stage2", type=Path, help="fresh: stage 2's preset (its pinned fedowen)")
    p.add_argument("--seeds", type=int, nargs="+", help="fresh: the attacked cells' seeds")
    p.add_argument("--clean-seeds", type=int, nargs="+", help="fresh: the clean cells' seeds")
    p.add_argument("--stage-1", choices=STAGE_2, default="held",
                   help="stage2: how stage 1 picked the arm (decision.md: 'held', or 'fallback' "
                   "where its holds column says no); written into the read command")
    args = p.parse_args(argv)
    raw = load(args.preset)
    if args.stage == "stage2":
        write(stage2(raw, args.arm, args.fraction, str(args.preset)), args.out,
              [f"Stage 2 of {args.preset} (its rule, step 4): {args.arm}, the pick, and fedowen "
               "(the defaults, pinned),", f"at {100 * args.fraction:g}% attackers; read with "
               f"python -m studies.backdoor.defaults_rule {args.out} --results RESULTS --out DIR "
               f"--stage-1 {args.stage_1}", "(step 2 (a) and (c); the clean cost is stage 1's)."])
        return 0
    if not args.seeds or not args.clean_seeds:
        p.error("fresh needs --seeds and --clean-seeds")
    if args.arm == NO_PICK:
        made = fresh_defaults(raw, args.seeds, args.clean_seeds,
                              used_seeds(args.preset.parent, skip=args.out))
        write(made, args.out, [f"The acceptance's fresh seeds for {args.preset}, which picked "
                               "no arm: the app's defaults alone (adopted, no key pinned);",
                               "read with python -m studies.backdoor.defaults_rule (no "
                               "reference: ASR, payout and clean accuracy)."])
        return 0
    if args.stage2 is None:
        p.error("fresh needs --stage2 (stage 2's preset) unless --arm none")
    raw2 = load(args.stage2)
    made = fresh(raw, raw2, args.arm, args.seeds, args.clean_seeds,
                 used_seeds(args.preset.parent, skip=args.out))
    write(made, args.out, [f"The acceptance's fresh seeds for {args.preset}: adopted (the app's "
                           f"defaults, checked to be {args.arm}) against fedowen (stage 1's "
                           "defaults as", f"{args.stage2} pins them); read with python -m "
                           "studies.backdoor.defaults_rule."])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
