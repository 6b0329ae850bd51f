"""``indicator``: BackdoorIndicator (Li and Dai, "BackdoorIndicator: Leveraging OOD Data for
Proactive Backdoor Detection in Federated Learning", USENIX Security 2024; public code
ybdai7/Backdoor-indicator-defense, ``participants/servers/IndicatorServer.py``).

The server plants an indicator task into the global model before it sends it: it trains the
model on out-of-distribution samples with assigned labels (balanced over the classes) until
it classifies them as assigned. A benign client's training on its own data forgets that
task; a backdoor's training keeps it, since the backdoor's samples are out of distribution
too and pull the same way for its target label. So an update whose model still classifies the
indicator samples of some one label with at least ``indicator-threshold`` accuracy is flagged
and rejected.

Each round, as the public code does with ``replace_original_bn``:

- :meth:`Indicator.dispatch`: the model is planted (:meth:`IndicatorTask.plant`); the model
  sent is the planted model's update keys (its parameters) with the global model's
  normalisation statistics and counters from before the planting (:func:`sent_model`); the
  planted model's statistics are kept for the check;
- :meth:`Indicator.screen`: each update's update keys with the planted statistics
  (:func:`checked_model`) are scored on the indicator samples, per assigned label; the highest
  label accuracy (:func:`strongest`) at or above the threshold rejects it. The updates are read
  against the model sent (the planted one), as every step of the round reads them, and the
  strategy aggregates the rest from there.

The guard holds torch nowhere: the task (:class:`IndicatorTask`) trains and scores, e.g.
:class:`fedowen_strategy.defences.indicator_task.TorchIndicator` on the run's architecture and
the ServerApp's out-of-distribution set (``server_app.indicator``). The one state it keeps is
the round's planted statistics, from its dispatch to its screen of the same round.
Differences from the public code: docs/defences.md (BackdoorIndicator).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from fedowen_strategy.defences.base import Dispatching, Guard, GuardedRound, RoundView
from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.updates import is_update, update_norm


class IndicatorTask(Protocol):
    """What the guard asks of the indicator task: plant it, and score a model on it."""

    def plant(self, state: Mapping[str, NDArray], server_round: int, guards: Guards
              ) -> dict[str, NDArray]:
        """``state`` trained on the indicator samples (``indicator-epochs``, ``-lr``, ``-mu``
        of ``guards``), seeded by the round: every entry, statistics included."""

    def label_accuracy(self, state: Mapping[str, NDArray]) -> dict[int, float]:
        """Per assigned label, the share of its indicator samples ``state`` (in evaluation
        mode) classifies as that label."""


@dataclass(frozen=True)
class Planted:
    """One round's planting: the planted model's entries outside the update (its
    normalisation statistics and counters) and what it measured."""

    server_round: int
    statistics: dict[str, NDArray]
    record: dict[str, Any]


def sent_model(state: Mapping[str, NDArray], planted: Mapping[str, NDArray]
               ) -> dict[str, NDArray]:
    """The model sent: ``planted``'s update keys, ``state``'s other entries (normalisation
    statistics and counters from before the planting), in ``state``'s order."""
    return {k: planted[k] if is_update(k, v) else v for k, v in state.items()}


def checked_model(update: Mapping[str, NDArray], statistics: Mapping[str, NDArray]
                  ) -> dict[str, NDArray]:
    """The model an update is scored as: its update keys with the planted ``statistics``."""
    return {k: statistics.get(k, v) if not is_update(k, v) else v for k, v in update.items()}


def strongest(accuracy: Mapping[int, float]) -> tuple[int, float]:
    """The label of the highest accuracy and that accuracy (the lowest label in a tie, as the
    public code's ``list.index(max(...))``)."""
    label = min(accuracy, key=lambda lab: (-accuracy[lab], lab))
    return label, float(accuracy[label])


class Indicator(Guard):
    """BackdoorIndicator: planted at dispatch, read at screen (recorded: ``indicator`` with the
    planting's strongest label accuracy ``before`` and ``planted`` and their labels, the mean
    over labels of each, ``before_mean`` and ``planted_mean``, the planting's ``norm``, and per
    client its strongest ``accuracy`` and that label, ``labels``).

    Parameters
    ----------
    task : IndicatorTask, optional
        The indicator samples and the model to plant them in. The table's row is made without
        one; the ServerApp binds it (``server_app.indicator``), a library user passes it.
    """

    name = "indicator"

    def __init__(self, task: IndicatorTask | None = None) -> None:
        self.task = task
        self.planted: Planted | None = None

    def _task(self) -> IndicatorTask:
        if self.task is None:
            raise ValueError("defence 'indicator' has no indicator task: the ServerApp binds "
                             "one from indicator-ood (server_app.indicator); in a library, "
                             "pass Indicator(TorchIndicator(model, x_ood, y_assigned))")
        return self.task

    def dispatch(self, state: dict[str, NDArray], dispatching: Dispatching
                 ) -> dict[str, NDArray]:
        task = self._task()
        old = task.label_accuracy(state)
        trained = task.plant(state, dispatching.server_round, dispatching.guards)
        new = task.label_accuracy(trained)
        (label_before, before), (label, after) = strongest(old), strongest(new)
        sent = sent_model(state, trained)
        self.planted = Planted(
            dispatching.server_round,
            {k: v for k, v in trained.items() if not is_update(k, v)},
            {"before": before, "label_before": label_before, "planted": after, "label": label,
             "before_mean": float(np.mean(list(old.values()))),
             "planted_mean": float(np.mean(list(new.values()))),
             "norm": update_norm(sent, state)})
        return sent

    def screen(self, round_: GuardedRound, view: RoundView) -> GuardedRound:
        planted = self.planted
        if planted is None or planted.server_round != view.server_round:
            raise RuntimeError(
                f"defence 'indicator' screens round {view.server_round} but planted "
                f"{'nothing' if planted is None else f'round {planted.server_round}'}: the "
                "strategy must run the dispatch steps where it sends the model (FedOwen and "
                "Defended do: fedowen_strategy.defences.base.dispatch_model)")
        threshold = view.guards.indicator_threshold
        accuracy: dict[str, float] = {}
        labels: dict[str, int] = {}
        kept = []
        for upd in round_.updates:
            label, acc = strongest(self._task().label_accuracy(
                checked_model(upd.state, planted.statistics)))
            accuracy[upd.client_id], labels[upd.client_id] = acc, label
            if acc >= threshold:
                round_.rejected[upd.client_id] = (
                    f"BackdoorIndicator: accuracy {acc:.3g} on the indicator samples of label "
                    f"{label} >= indicator-threshold {threshold:g} (read as keeping the "
                    "planted task)")
            else:
                kept.append(upd)
        round_.updates = kept
        round_.record["indicator"] = {**planted.record, "accuracy": accuracy, "labels": labels}
        return round_

    def summary(self, guards: Guards) -> str:
        return (f"indicator (threshold {guards.indicator_threshold:g}, {guards.indicator_epochs} "
                f"epochs at lr {guards.indicator_lr:g}, mu {guards.indicator_mu:g})")
