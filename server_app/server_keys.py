"""The ServerApp's own run-config keys, each declared once (:mod:`fedowen_task.declare`).

:class:`ServerKeys` declares every key of ``[tool.flwr.app.config]`` that a ClientApp does not
read, in ``config.json``'s order: a key of its own by :func:`~fedowen_task.declare.key` (name,
default, type, rule, help), a key a library settings type owns (the estimator, the selectors,
the guards) by :func:`~fedowen_task.declare.owned`, which takes that type's declaration and
default. :class:`server_app.config.RunConfig` joins these to the task's keys
(:class:`fedowen_task.config.TaskConfig`), validates them and maps them onto the library's
settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.nodes import NODE_WAIT_TIMEOUT, ROUND_TIMEOUT
from fedowen_strategy.round.contribution import DEFAULT_UTILITY_METRIC, ValuationSettings
from fedowen_strategy.selectors import registry
from fedowen_strategy.selectors.adaptive import AdaptiveSettings
from fedowen_strategy.selectors.delta import DeltaSettings
from fedowen_strategy.selectors.delta_phi import DeltaPhiSettings
from fedowen_strategy.selectors.greedyfed import GreedyFedSettings
from fedowen_strategy.selectors.hics import HicsSettings
from fedowen_strategy.selectors.oort import OortSettings
from fedowen_strategy.selectors.posterior import PosteriorSettings
from fedowen_strategy.selectors.power_of_choice import PowerOfChoiceSettings
from fedowen_strategy.selectors.shared import SelectionParams
from fedowen_task.declare import ABSOLUTE_PATH, above, at_least, finite, key, owned, within


@dataclass(frozen=True)
class ServerKeys:
    """The server's run-config keys (each declared once: :mod:`fedowen_task.declare`; a
    library settings type's by :func:`owned`)."""

    num_server_rounds: int = key(100, "server rounds", rule=at_least(1))
    clients_per_round: int = key(10, "clients selected a round (k)", rule=at_least(1))
    fraction_evaluate: float = key(0.0, "the share of nodes that also evaluate (0: off)",
                                   rule=within(0, 1, note=" (0 = off)"))
    output_dir: str = key("", "where the run writes (empty: run-<id> in $FEDOWEN_OUTPUT, else "
                          "~/fedowen-runs)", rule=ABSOLUTE_PATH)
    test_max_samples: int = key(0, "a cap on the test examples (0: none)",
                                rule=at_least(0, " (0 = no cap)"))
    # The central evaluation's schedule (server_app.evaluation.evaluated): it reads the model,
    # never changes it, so a run's training is the same at any value.
    eval_every: int = key(1, "evaluate every N-th round (and the last 10)", rule=at_least(
        1, " (1: the test accuracy after every round)"))
    strategy: str = key("fedowen", "fedowen, a Flower strategy, a peer defence or module:Class")
    strategy_params: str = key("", "other constructor arguments: \"name=value ...\"")
    proximal_mu: float = key(0.0, "FedProx's mu", rule=at_least(0))
    valuation: str = owned(ValuationSettings, "method")
    valuation_params: str = key("", "the estimator's parameters: \"name=value ...\"")
    selection: str = key("auto", f"{' | '.join(registry.SELECTORS)}; auto: "
                         f"{registry.AUTO_WITH_PHI} when the valuation computes phi, else "
                         f"{registry.AUTO_WITHOUT_PHI}")
    aggregation: str = owned(ValuationSettings, "aggregation")
    budget_m: int = owned(ValuationSettings, "budget_m")
    owen_q: int = key(2, "owen-paper's inclusion levels Q", rule=at_least(1))
    utility_metric: str = key(DEFAULT_UTILITY_METRIC, "the coalition utility: neg-loss | "
                              "accuracy")
    game: str = owned(ValuationSettings, "game")
    phi_scale: str = owned(ValuationSettings, "phi_scale")
    temperature: float = owned(ValuationSettings, "temperature")
    epsilon: float = owned(AdaptiveSettings, "epsilon")
    ucb_c: float = owned(AdaptiveSettings, "c")
    tau: float = owned(AdaptiveSettings, "tau")
    max_norm_ratio: float = owned(Guards, "max_norm_ratio")
    # Robust update bounds (issue 14): see fedowen_strategy.defences.bounds.
    update_bound: str = owned(Guards, "update_bound")
    update_bound_multiple: float = owned(Guards, "update_bound_multiple")
    # Norm normalisation and Sybil links (issue 26): see fedowen_strategy.defences.bounds / links.
    norm_cap: str = owned(Guards, "norm_cap")
    norm_cap_multiple: float = owned(Guards, "norm_cap_multiple")
    value_cap_multiple: float = owned(Guards, "value_cap_multiple")
    value_cap_mode: str = owned(Guards, "value_cap_mode")
    link_cosine: float = owned(Guards, "link_cosine")
    round_timeout: float = key(ROUND_TIMEOUT, "seconds a round waits for replies",
                               rule=above(0))
    verbose: bool = key(False, "Flower's own records and every library line in the log")
    node_wait_timeout: float = key(NODE_WAIT_TIMEOUT, "seconds to wait for enough nodes",
                                   rule=above(0))
    # A run that learns nothing stops (server_app.stall); 0 = never.
    max_stalled_rounds: int = key(3, "stop after this many rounds without an accepted update "
                                  "(0: never)", rule=at_least(0, " (0: never stop a run that "
                                                              "accepts no update)"))
    duplicate_tolerance: float = owned(Guards, "duplicate_tolerance")
    update_filter: str = owned(Guards, "update_filter")
    robust_lr_threshold: int = owned(Guards, "robust_lr_threshold")
    aggregate_noise: float = owned(Guards, "aggregate_noise")
    # BatchNorm statistics bounded (opt-in): see fedowen_strategy.defences.statistics.
    statistics_cap: float = owned(Guards, "statistics_cap")
    statistics_rule: str = owned(Guards, "statistics_rule")
    # The peers' backdoor filters (issue 72, opt-in: listed in defences): docs/defences.md.
    alignins_sparsity: float = owned(Guards, "alignins_sparsity")
    alignins_lambda_s: float = owned(Guards, "alignins_lambda_s")
    alignins_lambda_c: float = owned(Guards, "alignins_lambda_c")
    multi_metrics_keep: float = owned(Guards, "multi_metrics_keep")
    flame_lambda: float = owned(Guards, "flame_lambda")
    indicator_threshold: float = owned(Guards, "indicator_threshold")
    indicator_epochs: int = owned(Guards, "indicator_epochs")
    indicator_lr: float = owned(Guards, "indicator_lr")
    indicator_mu: float = owned(Guards, "indicator_mu")
    # BackdoorIndicator's out-of-distribution samples, which the ServerApp loads
    # (server_app.indicator): their dataset and how many.
    indicator_ood: str = key("auto", "BackdoorIndicator's OOD dataset: auto (fashion-mnist for "
                             "mnist, femnist, medmnist; mnist for fashion-mnist; femnist for "
                             "cifar10) or a dataset name")
    indicator_samples: int = key(800, "BackdoorIndicator's OOD samples (whole batches of 64 "
                                 "kept)", rule=at_least(64, " (one batch of 64 at least)"))
    # The defence list, in order (issue 72): fedowen_strategy.defences.table, docs/defences.md.
    defences: str = key("auto", "the defences, in order: auto (the strategy's own list) | none | "
                        "names from docs/defences.md")
    uniform_mix: float = owned(ValuationSettings, "uniform_mix")
    weight_cap: float = owned(ValuationSettings, "weight_cap")
    bandit_memory: str = owned(AdaptiveSettings, "memory")
    bandit_discount: float = owned(AdaptiveSettings, "discount")
    link_memory: int = owned(SelectionParams, "link_memory")
    # The field's selectors and the posterior selector (issue 43): fedowen_strategy.selectors.
    poc_d: int = owned(PowerOfChoiceSettings, "poc_d")
    oort_exploration_min: float = owned(OortSettings, "oort_exploration_min")
    greedyfed_memory: str = owned(GreedyFedSettings, "greedyfed_memory")
    delta_estimator: str = owned(DeltaSettings, "delta_estimator")
    delta_floor: float = owned(DeltaSettings, "delta_floor")
    delta_sigma_weight: float = owned(DeltaSettings, "delta_sigma_weight")
    delta_score: str = owned(DeltaSettings, "delta_score")
    delta_draw: str = owned(DeltaSettings, "delta_draw")
    hics_temperature: float = owned(HicsSettings, "hics_temperature")
    hics_lambda: float = owned(HicsSettings, "hics_lambda")
    hics_gamma: float = owned(HicsSettings, "hics_gamma")
    hics_clusters: int = owned(HicsSettings, "hics_clusters")
    hics_rounds: int = owned(HicsSettings, "hics_rounds")
    hics_switch: float = owned(HicsSettings, "hics_switch")
    delta_phi_floor: float = owned(DeltaPhiSettings, "delta_phi_floor")
    selection_reward: str = owned(PosteriorSettings, "reward")
    selection_level: float = owned(PosteriorSettings, "resolve_level")
    selection_cap: float = owned(SelectionParams, "cap")
    # Exclusion after a resolved negative contribution, around any selector (issue 72,
    # deliver 4; opt-in): fedowen_strategy.selectors.exclusion.
    exclusion_level: float = owned(SelectionParams, "exclusion_level")
    exclusion_min_rounds: int = owned(SelectionParams, "exclusion_min_rounds")
    torch_threads: int = key(1, "the ServerApp's torch threads (0: torch's default)",
                             rule=at_least(0, " (0 = torch's default)"))
    valuation_workers: int = key(1, "threads that evaluate coalitions (0: one per core)",
                                 rule=at_least(0, " (1: the server's thread alone; 0: one per "
                                               "core the ServerApp may use)"))
    resume_from: str = key("", "an interrupted run's output dir, to continue it",
                           rule=ABSOLUTE_PATH)
    krum_malicious: int = owned(ValuationSettings, "krum_malicious")
    # Peer defences (issue 17): see fedowen_strategy.peers.fltrust / foolsgold.
    fltrust_root_size: int = key(0, "FLTrust's root set (0: the evaluation set)",
                                 rule=at_least(0, " (0 = the whole evaluation set)"))
    fltrust_root_epochs: int = key(1, "FLTrust's epochs on its root set", rule=at_least(1))
    fltrust_server_lr: float = key(1.0, "FLTrust's global learning rate", rule=finite(above(
        0, " (FLTrust's global learning rate; 1 applies its aggregate as it is)")))
    foolsgold_kappa: float = key(1.0, "FoolsGold's confidence kappa", rule=above(0))
