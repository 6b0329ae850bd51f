"""The adversaries' run-config keys, and the frozen adversary config built from them.

:class:`fedowen_task.config.TaskConfig` declares every ``adversary-*`` key of
``[tool.flwr.app.config]`` (its ``adversary_*`` fields, so a ClientApp reads them as its own);
their cross-key rules live here (:meth:`Trigger.problems`). :class:`AdversaryConfig` is the
one frozen view both apps and ``sim`` read: the keys under short names plus the run's seed,
which names the adversaries (:func:`adversary_ids`). Which kinds exist is the table's business
(:data:`fedowen_task.adversary.attacks.ATTACKS`); nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

#: The backdoor trigger's shapes and positions (:class:`Trigger`); ``bars`` is DBA's global
#: pattern (Xie et al., ICLR 2020), which the ``dba`` attackers plant one bar each.
TRIGGER_SHAPES = ("square", "plus", "bars")
TRIGGER_POSITIONS = ("bottom-right", "top-left", "center")
#: What ``adaptive-backdoor`` shapes its update to pass (``adversary-knows``): the norm bound
#: in force and the honest cone, or also every screen step of the run's defence list.
KNOWS = ("bounds", "defences")


@dataclass(frozen=True)
class Trigger:
    """A backdoor's trigger (the table's backdoor rows: ``backdoor``, ``dba``, ``neurotoxin``,
    ``adaptive-backdoor``; stamped by :mod:`fedowen_task.adversary.backdoor`).

    Parameters
    ----------
    shape : {"square", "plus", "bars"}
        A filled ``size x size`` square, a plus of arms ``size`` long through its centre, or
        DBA's pattern: ``parts`` bars of ``1 x size`` pixels in a grid of
        ``ceil(sqrt(parts))`` columns, ``gap`` pixels apart (4 bars of 4, gap 2: DBA's MNIST
        trigger, rows 0 and 3, columns 0-3 and 6-9 of its box).
    size : int
        Side of the trigger's bounding box (a bar's length for ``bars``), in pixels (>= 1).
    position : {"bottom-right", "top-left", "center"}
        Where the box sits (one pixel from the corner, or centred).
    target : int
        The class stamped images are relabelled to.
    poison_fraction : float
        Share of the attacker's training images stamped and relabelled each round, in (0, 1].
    parts : int
        ``bars``: how many bars (DBA's local triggers), >= 1.
    gap : int
        ``bars``: pixels between neighbouring bars, >= 0.
    """

    shape: str = "square"
    size: int = 3
    position: str = "bottom-right"
    target: int = 0
    poison_fraction: float = 0.5
    parts: int = 4
    gap: int = 2

    def problems(self) -> list[str]:
        """What is wrong with these settings, by run-config key (empty when nothing)."""
        checks = [
            (self.shape in TRIGGER_SHAPES,
             f"adversary-trigger={self.shape!r} is not one of {', '.join(TRIGGER_SHAPES)}"),
            (self.position in TRIGGER_POSITIONS,
             f"adversary-trigger-position={self.position!r} is not one of "
             f"{', '.join(TRIGGER_POSITIONS)}"),
            (self.size >= 1, f"adversary-trigger-size={self.size} must be >= 1 (pixels)"),
            (self.target >= 0, f"adversary-target={self.target} must be a class index >= 0"),
            (0.0 < self.poison_fraction <= 1.0,
             f"adversary-poison-fraction={self.poison_fraction} must lie in (0, 1]"),
            (self.parts >= 1, f"adversary-dba-parts={self.parts} must be >= 1 (DBA's MNIST "
             "trigger: 4)"),
            (self.gap >= 0, f"adversary-dba-gap={self.gap} must be >= 0 (pixels between "
             "bars; DBA's: 2)"),
        ]
        return [message for ok, message in checks if not ok]


def adversary_ids(num_partitions: int, fraction: float, seed: int) -> frozenset[int]:
    """Partition ids of the ``round(fraction * num_partitions)`` adversaries: a pure function
    of its arguments, so the clients, the ServerApp and the reports name the same ones."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"adversary-fraction={fraction!r} must lie in [0, 1]")
    count = round(fraction * num_partitions)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xAD]))
    return frozenset(int(i) for i in rng.permutation(num_partitions)[:count])


@dataclass(frozen=True)
class AdversaryConfig:
    """A run's simulated adversaries: ``adversary-<name>`` as ``<name>``, and the run's seed.

    Build it from a parsed run config (:meth:`of`, or ``TaskConfig.adversary()``); each field
    but ``seed`` is the key ``adversary-<field>`` (tests/test_adversary_table.py checks both
    ways).
    """

    fraction: float
    kind: str
    noise_std: float
    sybil_noise: float
    boost: float
    alie_z: float
    ipm_epsilon: float
    jitter: float
    trigger: str
    trigger_size: int
    trigger_position: str
    target: int
    poison_fraction: float
    statistics_scale: float
    dba_parts: int
    dba_gap: int
    neurotoxin_top: float
    knows: str
    seed: int

    @classmethod
    def of(cls, keys: Any, seed: int) -> AdversaryConfig:
        """The adversary config of a run config's ``adversary_*`` fields and seed."""
        return cls(seed=seed, **{f.name: getattr(keys, f"adversary_{f.name}")
                                 for f in fields(cls) if f.name != "seed"})

    def backdoor(self) -> Trigger:
        """The backdoor's trigger these keys describe."""
        return Trigger(self.trigger, self.trigger_size, self.trigger_position, self.target,
                       self.poison_fraction, self.dba_parts, self.dba_gap)

    @property
    def active(self) -> bool:
        """Whether the run has adversaries at all (``adversary-fraction > 0``)."""
        return self.fraction > 0

    def ids(self, num_partitions: int) -> frozenset[int]:
        """The adversarial partition ids (:func:`adversary_ids`)."""
        return adversary_ids(num_partitions, self.fraction, self.seed)

    def rank(self, partition: int, num_partitions: int) -> int:
        """The partition's place among the adversaries in id order (0 for the smallest id; DBA
        gives rank ``r`` bar ``r mod parts``); -1 for an honest partition."""
        ids = sorted(self.ids(num_partitions))
        return ids.index(partition) if partition in ids else -1

    def client_ids(self, num_partitions: int) -> frozenset[str]:
        """The adversaries as the client ids the records use (a simulated client's id is its
        partition id)."""
        return frozenset(str(i) for i in self.ids(num_partitions))

    def record(self, num_partitions: int) -> dict[str, Any]:
        """Who attacks and how (``adversaries.json``, less what the table adds): kind,
        fraction, seed, the partitions and their ids, then every parameter."""
        params = {f.name: getattr(self, f.name) for f in fields(self)
                  if f.name not in ("kind", "fraction", "seed")}
        return {"kind": self.kind, "fraction": self.fraction, "seed": self.seed,
                "num_partitions": num_partitions,
                "ids": [str(i) for i in sorted(self.ids(num_partitions))], **params}
