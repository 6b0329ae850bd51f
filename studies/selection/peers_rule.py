"""selection-peers-dev's rule (conf/selection-peers-dev.toml's header, issue 62 deliver 4) as
pure functions of the settings' validation scores, paired by seed; test accuracy never decides.

1. :func:`tune`: each new peer's knob takes the candidate of the higher mean val.
2. :func:`best_peer`: the highest mean val among the tuned new peers and selection-dev's tuned
   best of Power-of-Choice and Oort (``reference``, fixed as tuned there).
3. :func:`failures`: a contender fails a setting where its paired val difference against
   fedowen-random or the best peer has a 95% t-interval upper bound below 0.
4. :func:`read`: once every setting is read, the eligible contender of the highest val averaged
   over the settings is adopted; if none is, the one failing the fewest settings (ties: the
   higher mean).
5. :func:`leave_one_out` and :func:`kept`: each decision read again with each seed left out,
   and how many of those readings keep it.

The settings are :class:`studies.selection.development.Setting` (scores by arm, metric, seed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sim.stats import Interval
from studies.selection.cells import VAL
from studies.selection.development import Setting

#: The new peers' tuning candidates, by family (each as published, one knob).
NEW_PEERS = {"greedyfed": ("greedyfed-mean", "greedyfed-m0.9"),
             "delta": ("delta-s1", "delta-s0"),
             "hics-fl": ("hics-t0.03", "hics-t0.1")}
#: Who may become the default selection: today's (Algorithm 2) and the two candidates.
CONTENDERS = ("fedowen", "hics-phi", "delta-phi")
#: The anchor every contender is paired against.
RANDOM = "fedowen-random"
#: How many settings the rule averages over (step 4 waits for all of them).
SETTINGS = 6


@dataclass(frozen=True)
class Failure:
    """A contender below ``reference`` beyond the paired interval in ``setting``."""

    setting: str
    reference: str
    diff: Interval

    def text(self) -> str:
        return f"{self.setting}: {self.diff.text(signed=True)} vs {self.reference}"


@dataclass(frozen=True)
class Reading:
    """The rule's decisions over the settings read: per setting the tuned peers and the best
    peer, each contender's failures and mean val over the settings, and the adopted contender
    (None until :data:`SETTINGS` settings are read)."""

    tuned: dict[str, dict[str, str]]
    best: dict[str, str]
    failures: dict[str, list[Failure]]
    means: dict[str, float]
    adopted: str | None

    def failing(self, arm: str) -> list[str]:
        """The settings where ``arm`` fails, in reading order."""
        return list(dict.fromkeys(f.setting for f in self.failures[arm]))

    def eligible(self, arm: str) -> bool:
        return not self.failures[arm]

    @property
    def fallback(self) -> bool:
        """Whether the adopted contender is the fewest-failures fallback (none eligible)."""
        return self.adopted is not None and not self.eligible(self.adopted)


def tune(s: Setting) -> dict[str, str]:
    """Step 1: each new peer family's candidate of the higher mean val (the first on a tie)."""
    return {family: max(arms, key=s.mean) for family, arms in NEW_PEERS.items()}


def best_peer(s: Setting, reference: str) -> str:
    """Step 2: the arm of the highest mean val among the tuned new peers and ``reference``."""
    return max([*tune(s).values(), reference], key=s.mean)


def failures(s: Setting, best: str) -> dict[str, list[Failure]]:
    """Step 3 in one setting: each contender's paired val differences against fedowen-random
    and ``best`` whose interval lies below 0 (with at least two seeds)."""
    out: dict[str, list[Failure]] = {}
    for arm in CONTENDERS:
        out[arm] = []
        for ref in (RANDOM, best):
            d = s.diff(arm, ref, VAL)
            if d.n > 1 and d.hi < 0:
                out[arm].append(Failure(s.name, ref, d))
    return out


def read(found: Sequence[Setting], reference: Mapping[str, str], total: int = SETTINGS
         ) -> Reading:
    """Steps 1-4 over the settings ``found`` (each complete), ``reference[name]`` being a
    setting's best of Power-of-Choice and Oort from selection-dev; a contender is adopted only
    when ``total`` settings are read."""
    tuned = {s.name: tune(s) for s in found}
    best = {s.name: best_peer(s, reference[s.name]) for s in found}
    fails: dict[str, list[Failure]] = {arm: [] for arm in CONTENDERS}
    for s in found:
        for arm, found_fails in failures(s, best[s.name]).items():
            fails[arm] += found_fails
    means = {arm: (sum(s.mean(arm) for s in found) / len(found) if found else -math.inf)
             for arm in CONTENDERS}
    adopted = None
    if found and len(found) >= total:
        failing = {arm: len({f.setting for f in fails[arm]}) for arm in CONTENDERS}
        adopted = min(CONTENDERS, key=lambda a: (failing[a], -means[a]))
    return Reading(tuned, best, fails, means, adopted)


def without_seed(s: Setting, seed: int) -> Setting:
    """``s`` with ``seed`` left out of every arm's scores, distinct and top shares."""
    return Setting(s.name,
                   {arm: {m: {k: v for k, v in by_seed.items() if k != seed}
                          for m, by_seed in metrics.items()} for arm, metrics in s.scores.items()},
                   {arm: {k: v for k, v in d.items() if k != seed}
                    for arm, d in s.distinct.items()},
                   {arm: {k: v for k, v in d.items() if k != seed} for arm, d in s.top.items()})


def leave_one_out(found: Sequence[Setting], reference: Mapping[str, str],
                  seeds: Sequence[int], total: int = SETTINGS) -> list[Reading]:
    """Step 5: :func:`read` again with each of ``seeds`` left out in turn (selection-dev's
    best of Power-of-Choice and Oort kept as tuned there)."""
    return [read([without_seed(s, seed) for s in found], reference, total) for seed in seeds]


def decisions(reading: Reading) -> dict[str, str]:
    """Every decision of a reading by name: each setting's tuned peers, best peer and each
    contender's pass or fail there; once adopted, each contender's eligibility and the
    adopted contender."""
    out = {}
    for name, tuned in reading.tuned.items():
        for family, arm in tuned.items():
            out[f"{name}: {family} tuned"] = arm
        out[f"{name}: best peer"] = reading.best[name]
        for arm in CONTENDERS:
            out[f"{name}: {arm}"] = "fails" if name in reading.failing(arm) else "passes"
    if reading.adopted is not None:
        for arm in CONTENDERS:
            out[f"{arm} eligible"] = "yes" if reading.eligible(arm) else "no"
        out["adopted"] = reading.adopted
    return out


def kept(full: Reading, loo: Sequence[Reading]) -> dict[str, tuple[str, int]]:
    """Each decision of ``full`` with how many of the ``loo`` readings make the same one."""
    made = [decisions(r) for r in loo]
    return {key: (value, sum(d.get(key) == value for d in made))
            for key, value in decisions(full).items()}
