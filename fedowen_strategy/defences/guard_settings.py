"""The update guards' settings: :class:`Guards`, with the app's defaults.

Each field declares the run-config key of the same name (:func:`fedowen_task.declare.key`) and
:meth:`Guards.problems` holds their rules; :data:`Defence` pairs a strategy's guards with its
resolved norm cap. The defences that read them are the steps of the run's list
(:mod:`fedowen_strategy.defences.table`, docs/defences.md); each step reads its own keys here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

from fedowen_strategy.defences.bounds import NORM_CAPS, UPDATE_BOUNDS, VALUE_CAP_MODES
from fedowen_strategy.defences.majority import UPDATE_FILTERS
from fedowen_strategy.defences.statistics import STATISTICS_RULES
from fedowen_strategy.settings import NO_KEYS, Keys, Settings, key, one_of
from fedowen_task import declare


@dataclass(frozen=True)
class Guards(Settings):
    """The update guards (defaults: the app's).

    Parameters
    ----------
    max_norm_ratio : float
        Reject updates farther from the global model than this multiple of its norm (0: off).
    update_bound : {"none", "clip", "reject"}
        Bound every update by ``update_bound_multiple`` x the round's lower-median update
        norm per example: clip it to that norm or reject it.
    update_bound_multiple : float
        The multiple of that median the bound allows (> 1).
    norm_cap : {"auto", "none", "median", "server"}
        Norm normalisation before valuation and aggregation: every update rescaled to at most
        ``norm_cap_multiple`` x a reference norm, the round's lower-median update norm
        (``median``) or the norm of one server step's update (``server``); ``auto`` is
        ``median`` for a method that computes contributions and ``none`` for the others
        (:func:`fedowen_strategy.round.contribution.resolve_auto`).
    norm_cap_multiple : float
        The multiple of the reference norm (> 0).
    value_cap_multiple : float
        > 0 (default 1): the updates are valued rescaled to this multiple of the norm cap's
        reference (and averaged at ``norm_cap_multiple``), so an update's size above it buys
        no phi; 0: they are valued as they are averaged. It follows the norm cap: where the
        cap resolves to ``none`` there is no reference, and the updates are valued as
        averaged.
    value_cap_mode : {"at-most", "exactly"}
        How the value cap rescales: updates above it down to it (``at-most``), or every
        non-zero update to exactly it (``exactly``, the default: phi reads the direction
        alone, so a booster earns what its unscaled step would, and a short honest step is
        valued at the reference's length). Needs ``value_cap_multiple`` > 0 for ``exactly``.
        ``at-most`` did not stop boosting from paying on development seeds (a booster whose
        honest step is below the reference still gains up to it); ``exactly`` at multiple 1
        held boosted and adaptive attackers to an honest payout there, and on fresh seeds
        20-24 at MNIST alpha 0.1 but not at alpha 0.01 or on FashionMNIST, where a boosted
        update still moves the model further and is selected again
        (conf/defaults-next-fresh.toml; docs/arena.md).
    link_cosine : float
        Updates with pairwise cosine above it are linked into one player of the game, their
        phi and weight split among them (0: off). Applies to methods that compute
        contributions.
    duplicate_tolerance : float
        Updates within this relative distance of each other are copies
        (:func:`fedowen_strategy.defences.links.duplicate_groups`; 0: off): in the round they
        are caught a group of copies gets one member's weight, and its client ids are banned
        (never selected again, pay forfeited). Keep it at copy level: under one-class non-IID
        data honest updates came within 0.0007 of each other (docs/results/duplicates/).
    update_filter : {"none", "majority", "server-direction"}
        ``majority``: only the largest cluster of the round's update directions (HDBSCAN on
        cosine distances, a strict majority at least; :mod:`fedowen_strategy.defences.majority`,
        FLAME's filter) is valued and averaged; the rest are rejected (opt-in, issue 45).
        ``server-direction``: only updates of positive cosine with the server's own step on
        the evaluation set (FLTrust's trust as a filter,
        :mod:`fedowen_strategy.defences.server_direction`; opt-in, issue 45).
    robust_lr_threshold : int
        The robust learning rate's sign vote on the round's aggregate: where fewer than this
        many more updates agree on a coordinate's sign than disagree, the server's step there
        is reversed (:mod:`fedowen_strategy.defences.robust_lr`; 0: off; opt-in, issue 45).
    aggregate_noise : float
        FLAME's noise on the round's aggregate, standard deviation this multiple of the
        round's median update norm (the paper's lambda, 0.001; 0: off; opt-in, issue 45).
    statistics_cap : float
        > 0: each update's normalisation statistics (``running_mean``, ``running_var``)
        moved back towards the global model's until their deviation from them is at most this
        multiple of the round's lower-median deviation, the update keys untouched
        (:mod:`fedowen_strategy.defences.statistics`); 0 (the default): off. A value below 1
        caps the median client too. Opt-in beside ``statistics_rule``: measured, the cap at 2
        or 3 also held the huge-statistics attacker but clipped honest clients in clean runs
        (docs/results/statistics-guard/).
    statistics_rule : {"median", "mean"}
        How the aggregate combines the clients' normalisation statistics: their
        coordinate-wise weighted median under the round's aggregation weights (``median``, the
        default: one client in ten sending ``running_var`` 1e6 or its own x 4 leaves them
        where honest clients put them) or the weighted mean (``mean``, the rule before issue
        70). FedOwen, Flower's strategies and the peers alike
        (:func:`fedowen_strategy.defences.statistics.guard_statistics`); models without
        statistics: nothing to do.
    alignins_sparsity : float
        AlignIns' top-k share of coordinates (by magnitude) whose signs its masked principal
        sign alignment reads, in (0, 1] (the public code's 0.3;
        :mod:`fedowen_strategy.defences.alignins`, opt-in, issue 72).
    alignins_lambda_s, alignins_lambda_c : float
        AlignIns' thresholds (> 0, the public code's 1.0): an update is kept only where its
        sign-alignment (``_s``) and its direction-alignment (``_c``) z-scores are below them.
    multi_metrics_keep : float
        MultiMetrics' share of the round kept, the lowest whitened scores, in (0, 1] (the
        public code's 0.3; at least one update; :mod:`fedowen_strategy.defences.
        multi_metrics`, opt-in, issue 72).
    flame_lambda : float
        FLAME's noise level (the paper's lambda, 0.001): the ``flame`` step adds Gaussian
        noise of standard deviation this x its clip bound (the round's median update norm) to
        the aggregate's parameters (>= 0, 0: no noise; :mod:`fedowen_strategy.defences.flame`,
        opt-in, issue 72). ``aggregate-noise`` is the noise alone, inside FedOwen's list.
    indicator_threshold : float
        BackdoorIndicator's flag, in (0, 1]: an update whose model classifies the planted
        out-of-distribution samples of some one assigned label with at least this accuracy
        kept the indicator and is rejected (the public code's 95%;
        :mod:`fedowen_strategy.defences.indicator`, opt-in, issue 72).
    indicator_epochs : int
        Epochs of the server's planting on the indicator samples each round (>= 1; the public
        code's 200).
    indicator_lr : float
        The planting's SGD learning rate (> 0; the public code's 0.005, momentum 0.9, weight
        decay 5e-4, x 0.8 at epochs 10, 20, 30, 160, 200, ...).
    indicator_mu : float
        The planting's pull towards the model it starts from: ``mu / 2 x ||w - w0||`` added to
        its loss (>= 0; the public code's 0.4).
    """

    max_norm_ratio: float = declare.key(
        10.0, "reject updates beyond this x the model's norm (0: off)", name="max-norm-ratio")
    update_bound: str = declare.key(
        "none", "clip | reject | none: updates beyond the bound", name="update-bound")
    update_bound_multiple: float = declare.key(
        3.0, "the bound, x the round's median norm per example", name="update-bound-multiple")
    norm_cap: str = declare.key(
        "auto", "rescale updates to a reference: median | server | none | auto", name="norm-cap")
    norm_cap_multiple: float = declare.key(
        2.0, "the norm cap, x its reference", name="norm-cap-multiple")
    value_cap_multiple: float = declare.key(
        1.0, "updates valued at this x the reference (0: as averaged)", name="value-cap-multiple")
    value_cap_mode: str = declare.key(
        "exactly", "exactly | at-most the value cap", name="value-cap-mode")
    link_cosine: float = declare.key(
        0.98, "updates above this cosine are one player (0: off)", name="link-cosine")
    duplicate_tolerance: float = declare.key(
        1e-6, "updates this close are copies (0: off)", name="duplicate-tolerance")
    update_filter: str = declare.key(
        "none", "none | majority | server-direction", name="update-filter")
    robust_lr_threshold: int = declare.key(
        0, "the robust learning rate's theta (0: off)", name="robust-lr-threshold")
    aggregate_noise: float = declare.key(
        0.0, "noise on the aggregate, x the median norm (0: off)", name="aggregate-noise")
    statistics_cap: float = declare.key(
        0.0, "cap BatchNorm statistics' deviation at this x its median (0: off; < 1 "
        "caps the median client too)", name="statistics-cap")
    statistics_rule: str = declare.key(
        "median", "median | mean: how the aggregate combines the clients' BatchNorm statistics",
        name="statistics-rule")
    alignins_sparsity: float = declare.key(
        0.3, "AlignIns' top-k share of coordinates for sign alignment, in (0, 1]",
        name="alignins-sparsity")
    alignins_lambda_s: float = declare.key(
        1.0, "AlignIns' sign-alignment z-score threshold (> 0)", name="alignins-lambda-s")
    alignins_lambda_c: float = declare.key(
        1.0, "AlignIns' direction-alignment z-score threshold (> 0)", name="alignins-lambda-c")
    multi_metrics_keep: float = declare.key(
        0.3, "MultiMetrics' share of the round kept (lowest scores), in (0, 1]",
        name="multi-metrics-keep")
    flame_lambda: float = declare.key(
        0.001, "FLAME's noise, x its clip bound (the round's median norm; 0: none), >= 0",
        name="flame-lambda")
    indicator_threshold: float = declare.key(
        0.95, "BackdoorIndicator: reject an update keeping this accuracy on a planted label, "
        "in (0, 1]", name="indicator-threshold")
    indicator_epochs: int = declare.key(
        200, "BackdoorIndicator: the planting's epochs on its samples each round (>= 1)",
        name="indicator-epochs")
    indicator_lr: float = declare.key(
        0.005, "BackdoorIndicator: the planting's learning rate (> 0)", name="indicator-lr")
    indicator_mu: float = declare.key(
        0.4, "BackdoorIndicator: the planting's pull to the model it starts from (>= 0)",
        name="indicator-mu")

    def problems(self, keys: Keys = NO_KEYS) -> list[str]:
        """Everything wrong with these guards (:class:`~fedowen_strategy.settings.Settings`)."""
        k = partial(key, keys)
        checks = [
            (self.max_norm_ratio >= 0,
             f"{k('max_norm_ratio')}={self.max_norm_ratio!r} must be >= 0 (0 = off)"),
            (self.update_bound_multiple > 1,
             f"{k('update_bound_multiple')}={self.update_bound_multiple!r} must be > 1 (e.g. 3)"),
            (self.norm_cap_multiple > 0,
             f"{k('norm_cap_multiple')}={self.norm_cap_multiple!r} must be > 0 (1: the "
             "reference norm)"),
            (self.value_cap_multiple >= 0,
             f"{k('value_cap_multiple')}={self.value_cap_multiple!r} must be >= 0 (0: value "
             "the updates as they are averaged)"),
            (0 <= self.link_cosine < 1,
             f"{k('link_cosine')}={self.link_cosine!r} must lie in [0, 1) (0 = off)"),
            (0 <= self.duplicate_tolerance < 1,
             f"{k('duplicate_tolerance')}={self.duplicate_tolerance!r} must lie in [0, 1) "
             "(0 = off)"),
            (self.robust_lr_threshold >= 0,
             f"{k('robust_lr_threshold')}={self.robust_lr_threshold!r} must be >= 0 (0 = off; "
             "e.g. 4 of 10 clients a round)"),
            (self.aggregate_noise >= 0,
             f"{k('aggregate_noise')}={self.aggregate_noise!r} must be >= 0 (0 = off; FLAME's "
             "0.001)"),
            (math.isfinite(self.statistics_cap) and self.statistics_cap >= 0,
             f"{k('statistics_cap')}={self.statistics_cap!r} must be finite and >= 0 (0 = off; "
             "e.g. 3; below 1 it caps the median client too)"),
            (0 < self.alignins_sparsity <= 1,
             f"{k('alignins_sparsity')}={self.alignins_sparsity!r} must lie in (0, 1] (AlignIns' "
             "0.3: the top 30% of coordinates by magnitude)"),
            (math.isfinite(self.alignins_lambda_s) and self.alignins_lambda_s > 0,
             f"{k('alignins_lambda_s')}={self.alignins_lambda_s!r} must be finite and > 0 "
             "(AlignIns' 1.0)"),
            (math.isfinite(self.alignins_lambda_c) and self.alignins_lambda_c > 0,
             f"{k('alignins_lambda_c')}={self.alignins_lambda_c!r} must be finite and > 0 "
             "(AlignIns' 1.0)"),
            (0 < self.multi_metrics_keep <= 1,
             f"{k('multi_metrics_keep')}={self.multi_metrics_keep!r} must lie in (0, 1] "
             "(MultiMetrics' 0.3: the lowest-scoring 30% of the round)"),
            (math.isfinite(self.flame_lambda) and self.flame_lambda >= 0,
             f"{k('flame_lambda')}={self.flame_lambda!r} must be finite and >= 0 (FLAME's "
             "0.001; 0: no noise)"),
            (0 < self.indicator_threshold <= 1,
             f"{k('indicator_threshold')}={self.indicator_threshold!r} must lie in (0, 1] "
             "(BackdoorIndicator's 0.95: an accuracy on the planted samples of one label)"),
            (self.indicator_epochs >= 1,
             f"{k('indicator_epochs')}={self.indicator_epochs!r} must be >= 1 "
             "(BackdoorIndicator's 200)"),
            (math.isfinite(self.indicator_lr) and self.indicator_lr > 0,
             f"{k('indicator_lr')}={self.indicator_lr!r} must be finite and > 0 "
             "(BackdoorIndicator's 0.005)"),
            (math.isfinite(self.indicator_mu) and self.indicator_mu >= 0,
             f"{k('indicator_mu')}={self.indicator_mu!r} must be finite and >= 0 "
             "(BackdoorIndicator's 0.4; 0: no pull)"),
        ]
        found = [message for ok, message in checks if not ok]
        found += one_of(k("update_bound"), self.update_bound, UPDATE_BOUNDS)
        found += one_of(k("norm_cap"), self.norm_cap, NORM_CAPS)
        found += one_of(k("value_cap_mode"), self.value_cap_mode, VALUE_CAP_MODES)
        found += one_of(k("update_filter"), self.update_filter, UPDATE_FILTERS)
        found += one_of(k("statistics_rule"), self.statistics_rule, STATISTICS_RULES)
        if self.value_cap_mode == "exactly" and self.value_cap_multiple == 0:
            found.append(f"{k('value_cap_mode')}='exactly' values every update at "
                         f"{k('value_cap_multiple')} x the norm cap's reference: set "
                         f"{k('value_cap_multiple')} > 0 (e.g. 1.0)")
        return found


#: A strategy's guards in force and its resolved norm cap (what an omniscient attacker reads).
Defence = tuple[Guards, str]
