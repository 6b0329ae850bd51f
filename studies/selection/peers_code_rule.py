"""selection-peers-code's rule (conf/selection-peers-code.toml's header) as pure functions of
the settings' validation scores, paired by seed, over selection-peers-dev's reading
(:mod:`.peers_rule`); test accuracy never decides.

1. :func:`tune_code`: each code-form peer's knob takes the candidate of the higher mean val
   (hics-code's temperature; a tie: the first listed, 0.03);
2. :func:`best_code_peer`: the highest mean val among selection-peers-dev's best peer and the
   tuned code-form peers (a tie: the earlier grid's arm);
3. :func:`read_code`: the default adopted by selection-peers-dev (on its own settings read,
   which this grid's may not all be) stays adopted; each
   contender's paired val difference against that best peer is reported, and
   :meth:`CodeReading.short` names the settings where the adopted default's upper bound is
   below 0;
5. :func:`leave_one_out_code` and :func:`kept_code`: the decisions again with each seed left out
   (selection-peers-dev's reading with it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sim.stats import Interval
from studies.selection.development import Setting
from studies.selection.peers_rule import CONTENDERS, SETTINGS, Reading, read, without_seed

#: The code-form peers' candidates, by family (delta-code: the code's defaults, no knob).
CODE_PEERS = {"delta-code": ("delta-code",),
              "hics-code": ("hics-code-t0.03", "hics-code-t0.1")}


@dataclass(frozen=True)
class CodeReading:
    """selection-peers-dev's reading (``earlier``), and per setting read here: the code-form
    peers tuned, the best peer of either reading, each contender's paired val difference
    against it."""

    earlier: Reading
    tuned: dict[str, dict[str, str]]
    best: dict[str, str]
    vs_best: dict[str, dict[str, Interval]]

    @property
    def adopted(self) -> str | None:
        """The default selection, as selection-peers-dev adopted it (None until it did)."""
        return self.earlier.adopted

    def below(self, arm: str) -> list[tuple[str, Interval]]:
        """The settings where ``arm`` is below the best peer beyond the paired interval."""
        return [(name, d[arm]) for name, d in self.vs_best.items()
                if d[arm].n > 1 and d[arm].hi < 0]

    def short(self) -> list[tuple[str, Interval]]:
        """Where the adopted default falls short of the best peer of either reading."""
        return [] if self.adopted is None else self.below(self.adopted)


def tune_code(s: Setting) -> dict[str, str]:
    """Step 1: each code-form family's candidate of the higher mean val (the first on a tie)."""
    return {family: max(arms, key=s.mean) for family, arms in CODE_PEERS.items()}


def best_code_peer(s: Setting, earlier_best: str) -> str:
    """Step 2: the arm of the highest mean val among ``earlier_best`` and the tuned code-form
    peers (the earlier grid's arm on a tie)."""
    return max([earlier_best, *tune_code(s).values()], key=s.mean)


def read_code(found: Sequence[Setting], reference: Mapping[str, str], total: int = SETTINGS,
              earlier_found: Sequence[Setting] | None = None) -> CodeReading:
    """Steps 1-3 over the settings ``found`` (each complete, this grid's arms beside
    selection-peers-dev's), over selection-peers-dev's reading of ``earlier_found`` (the
    settings it reads, which this grid's may not all be; default ``found``): its best peers
    and the default it adopted. ``reference`` (every setting of ``earlier_found``) and
    ``total`` as :func:`.peers_rule.read` takes them."""
    earlier = read(found if earlier_found is None else earlier_found, reference, total)
    tuned = {s.name: tune_code(s) for s in found}
    best = {s.name: best_code_peer(s, earlier.best[s.name]) for s in found}
    vs_best = {s.name: {arm: s.diff(arm, best[s.name]) for arm in CONTENDERS} for s in found}
    return CodeReading(earlier, tuned, best, vs_best)


def decisions_code(r: CodeReading) -> dict[str, str]:
    """Every decision of a reading by name: per setting the code-form peers tuned, the best
    peer, and each contender below it or not."""
    out = {}
    for name, tuned in r.tuned.items():
        for family, arm in tuned.items():
            if len(CODE_PEERS[family]) > 1:
                out[f"{name}: {family} tuned"] = arm
        out[f"{name}: best peer"] = r.best[name]
        for arm in CONTENDERS:
            below = any(n == name for n, _ in r.below(arm))
            out[f"{name}: {arm} vs best peer"] = "below" if below else "not below"
    if r.adopted is not None:
        out["adopted (selection-peers-dev)"] = r.adopted
    return out


def leave_one_out_code(found: Sequence[Setting], reference: Mapping[str, str],
                       seeds: Sequence[int], total: int = SETTINGS,
                       earlier_found: Sequence[Setting] | None = None) -> list[CodeReading]:
    """Step 5: :func:`read_code` again with each of ``seeds`` left out in turn, of both
    grids' settings."""
    return [read_code([without_seed(s, seed) for s in found], reference, total,
                      None if earlier_found is None
                      else [without_seed(s, seed) for s in earlier_found])
            for seed in seeds]


def kept_code(full: CodeReading, loo: Sequence[CodeReading]) -> dict[str, tuple[str, int]]:
    """Each decision of ``full`` with how many of the ``loo`` readings make the same one."""
    made = [decisions_code(r) for r in loo]
    return {key: (value, sum(d.get(key) == value for d in made))
            for key, value in decisions_code(full).items()}
