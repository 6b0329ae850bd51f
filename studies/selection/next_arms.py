"""The next confirmation's selector arms, per setting, from the peers' readings (issue 62).

selection-peers-dev's reading (``selection-decisions.json``) names, per setting, each new peer's
tuned arm and the best peer, and, once every setting is read, the adopted default; the
follow-up's reading (``selection-code-decisions.json``, optional) widens the best peer to either
published reading. This writes each arm's run-config keys as the presets that ran it declare
them (conf/selection-peers-dev.toml, conf/selection-dev.toml, conf/selection-peers-code.toml),
so the next confirmation's presets copy them rather than re-typing them; decided on
development seeds and validation, they are scored there on fresh seeds.

    python -m studies.selection.next_arms \\
        --decisions docs/results/selection-peers-dev/selection-decisions.json \\
        [--code-decisions docs/results/selection-peers-code/selection-code-decisions.json] \\
        --out docs/results/selection-peers-dev/next-arms.toml
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sim.presets import load_preset

#: The presets whose variants the arms are, in the order a name is looked up.
PRESETS = (Path("conf/selection-peers-dev.toml"), Path("conf/selection-peers-code.toml"),
           Path("conf/selection-dev.toml"))


def arms(decisions: Mapping[str, Any], code: Mapping[str, Any] | None = None
         ) -> dict[str, dict[str, str]]:
    """``{setting: {arm: variant}}``: each new peer tuned, the better selector (the best peer,
    of either reading when ``code`` is given) and the default. Stops, saying what is missing,
    until selection-peers-dev has adopted a default (and the follow-up has read every
    setting)."""
    if decisions.get("adopted") is None:
        raise SystemExit("selection-peers-dev has adopted no default yet (settings read: "
                         f"{len(decisions.get('settings_read', []))} of "
                         f"{decisions.get('settings_total')}): finish and read its grid first")
    if code is not None and len(code.get("settings_read", [])) < code.get("settings_total", 0):
        raise SystemExit(f"the follow-up has read {len(code['settings_read'])} of "
                         f"{code['settings_total']} settings: finish and read its grid first, "
                         "or leave --code-decisions out")
    out = {}
    for name, found in decisions["settings"].items():
        best = code["settings"][name]["best_peer"] if code is not None else found["best_peer"]
        out[name] = {**found["tuned"], "better-selector": best, "default": decisions["adopted"]}
    return out


def arm_keys(variant: str, presets: Sequence[Path] = PRESETS) -> dict[str, Any]:
    """A variant's run-config keys as the first preset declaring it has them."""
    for path in presets:
        found = load_preset(path).variants.get(variant)
        if found is not None:
            return dict(found)
    raise SystemExit(f"variant {variant!r} is in none of {', '.join(map(str, presets))}")


def toml_text(by_setting: Mapping[str, Mapping[str, str]],
              presets: Sequence[Path] = PRESETS) -> str:
    """One table per setting and arm: the variant's name and its keys."""
    lines = ["# The next confirmation's selector arms per setting (written by python -m "
             "studies.selection.next_arms", "# from the peers' readings; decided on development "
             "seeds 0-4 and validation only).", ""]
    for name, by_arm in by_setting.items():
        for arm, variant in by_arm.items():
            keys = ", ".join(f"{k} = {json.dumps(v)}" for k, v in arm_keys(variant, presets)
                             .items())
            lines += [f'[settings."{name}"."{arm}"]', f"variant = {json.dumps(variant)}",
                      f"keys = {{ {keys} }}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--decisions", type=Path, required=True,
                   help="selection-peers-dev's selection-decisions.json")
    p.add_argument("--code-decisions", type=Path, default=None,
                   help="the follow-up's selection-code-decisions.json (optional)")
    p.add_argument("--out", type=Path, required=True, help="the TOML to write")
    args = p.parse_args(argv)
    code = json.loads(args.code_decisions.read_text()) if args.code_decisions else None
    by_setting = arms(json.loads(args.decisions.read_text()), code)
    args.out.write_text(toml_text(by_setting))
    print(f"[next-arms] wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
