"""The ServerApp's run configuration: the task keys plus the server's, validated once.

Every key of ``[tool.flwr.app.config]`` in pyproject.toml maps to one field here or in
:class:`fedowen_task.config.TaskConfig` (the keys a ClientApp also reads). ``parse_run_config``
reports every problem at once, one per mistake: unknown keys with the closest valid name,
wrong types, out-of-range values and cross-key rules (the estimator's minimum budget for N x M
and the parameters it accepts, the strategy's parameters), before any message is sent.

The library's settings types (:class:`~fedowen_strategy.round.contribution.ValuationSettings`,
:class:`~fedowen_strategy.selectors.shared.SelectionParams` and each selector's settings in
:data:`~fedowen_strategy.selectors.registry.SELECTORS`,
:class:`~fedowen_strategy.defences.guard_settings.Guards`)
carry the defaults and own the rules of their keys; one table, :data:`SETTINGS_KEYS`, maps
their fields onto run-config keys both ways: the run config's values onto the settings, the
settings' problems back onto the keys a user wrote.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from fedowen_strategy.defences.guard_settings import Guards
from fedowen_strategy.nodes import NODE_WAIT_TIMEOUT, ROUND_TIMEOUT
from fedowen_strategy.round.contribution import (
    DEFAULT_UTILITY_METRIC,
    UTILITY_METRICS,
    Choices,
    ValuationSettings,
    resolve_auto,
    selection_problems,
)
from fedowen_strategy.round.round_valuers import GAME_METHODS, round_budget
from fedowen_strategy.selectors import registry
from fedowen_strategy.selectors.adaptive import AdaptiveSettings
from fedowen_strategy.selectors.base import SelectorSettings
from fedowen_strategy.selectors.delta import DeltaSettings
from fedowen_strategy.selectors.delta_phi import DeltaPhiSettings
from fedowen_strategy.selectors.greedyfed import GreedyFedSettings
from fedowen_strategy.selectors.hics import HicsSettings
from fedowen_strategy.selectors.oort import OortSettings
from fedowen_strategy.selectors.posterior import PosteriorSettings
from fedowen_strategy.selectors.power_of_choice import PowerOfChoiceSettings
from fedowen_strategy.selectors.shared import SelectionParams
from fedowen_strategy.settings import Settings
from fedowen_strategy.valuation import ESTIMATORS, estimate_problems
from fedowen_task.config import ConfigError, TaskConfig, one_of, parse_config, parse_params
from fedowen_task.declare import (
    ABSOLUTE_PATH,
    above,
    at_least,
    finite,
    key,
    owned,
    settings_keys,
    within,
)

#: Each field of the library's settings types -> its run-config key, read from the fields'
#: declarations: the one table that maps the run config onto the settings and names the
#: settings' problems by the keys a user wrote. AdaptiveSettings' ``low_gain_scale``
#: (Algorithm 2's 0.1) has no key.
SETTINGS_KEYS: Mapping[str, str] = settings_keys((ValuationSettings, SelectionParams, Guards,
                                                  *registry.settings_types()))
#: Run-config keys a resumed run may change: how long and where it runs, not what it learns.
OPERATIONAL_KEYS = frozenset({"num-server-rounds", "data-dir", "output-dir", "resume-from",
                              "device", "round-timeout", "node-wait-timeout", "torch-threads",
                              "valuation-workers", "eval-every", "max-stalled-rounds",
                              "download", "verbose"})


@dataclass(frozen=True)
class RunConfig(TaskConfig):
    """FedOwen's run configuration: the task keys, then the server's (each declared once,
    :mod:`fedowen_task.declare`; a library settings type's by :func:`owned`)."""

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
    selection: str = key("auto", f"{' | '.join(registry.SELECTORS)}; auto: the valuation's "
                         "own")
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

    def choices(self) -> Choices:
        """FedOwen's selection, aggregation and norm cap, ``auto`` resolved for this
        valuation by :func:`fedowen_strategy.round.contribution.resolve_auto` (the one place)."""
        return resolve_auto(self.valuation, self.selection, self.aggregation, self.norm_cap,
                            self.selection_cap)

    def settings_values(self, cls: type[Settings]) -> dict[str, Any]:
        """The values of ``cls``'s fields in this run config, through :data:`SETTINGS_KEYS`
        (``params`` raw: :meth:`estimator_params` parses it)."""
        return {f.name: getattr(self, SETTINGS_KEYS[f.name].replace("-", "_"))
                for f in fields(cls) if f.name in SETTINGS_KEYS}

    def guards(self) -> Guards:
        """The update guards these keys describe."""
        return Guards(**self.settings_values(Guards))

    def selection_params(self) -> SelectionParams:
        """What every selector shares: the identity cap and the link memory."""
        return SelectionParams(**self.settings_values(SelectionParams))

    def selector_settings(self) -> SelectorSettings:
        """The resolved selector's settings (its keys in this run config)."""
        spec = registry.SELECTORS[self.choices().selection]
        return spec.settings(**self.settings_values(spec.settings)).for_run(
            self.num_server_rounds)

    def valuation_settings(self) -> ValuationSettings:
        """The estimator and aggregation these keys describe."""
        return ValuationSettings(**{**self.settings_values(ValuationSettings),
                                    "params": self.estimator_params()})

    def fedowen_arguments(self) -> dict[str, Any]:
        """The one mapping of the run config onto :class:`fedowen_strategy.FedOwen`'s
        arguments (the library's types, whose defaults are these keys' defaults)."""
        return {"clients_per_round": self.clients_per_round,
                "fraction_evaluate": self.fraction_evaluate,
                "valuation": self.valuation_settings(), "selection": self.selector_settings(),
                "selection_params": self.selection_params(), "guards": self.guards(),
                "seed": self.seed, "node_wait_timeout": self.node_wait_timeout,
                "query_timeout": self.round_timeout}

    def torch_device(self) -> str | None:
        """``device`` for torch's resolver: None for ``auto`` (the GPU when there is one)."""
        return None if self.device == "auto" else self.device

    def estimator_params(self) -> dict[str, Any]:
        """Keyword parameters for the estimator, plus ``valuation-params``
        ("key=value key=value", values parsed as int/float/bool).

        ``owen-q`` is Q, the number of inclusion levels of the paper's Algorithm 1, and goes to
        ``owen-paper`` only: the default ``owen`` stratifies q with one stratum per sample
        (set ``valuation-params = "strata=2"`` to pin Q strata there)."""
        params: dict[str, Any] = {}
        if self.valuation == "owen-paper":
            params["levels"] = self.owen_q
        params.update(parse_params(self.valuation_params, "valuation-params"))
        return params

    def resolved_output_dir(self, run_id: int) -> Path:
        """``resume-from`` (a resumed run continues in place), else ``output-dir``, else
        ``run-<id>`` in :func:`output_root`."""
        if self.resume_from:
            return Path(self.resume_from)
        if self.output_dir:
            return Path(self.output_dir)
        return output_root() / f"run-{run_id}"

    def problems(self) -> list[str]:
        """Task problems, the server's own keys, the library settings' (named by their keys),
        then the cross-key rules of valid settings: one problem per mistake."""
        bad = super().problems() + self._server_problems()
        try:
            params = self.estimator_params()
        except ValueError as err:  # valuation-params is not "key=value ..."
            bad.append(str(err))
            params = None
        valuation = ValuationSettings.problems_of(
            {**self.settings_values(ValuationSettings), "params": params or {}}, SETTINGS_KEYS)
        owners: list[type[Settings]] = [SelectionParams, *registry.settings_types()]
        selection = list(dict.fromkeys(  # a key two selectors read: one problem
            problem for cls in owners
            for problem in cls.problems_of(self.settings_values(cls), SETTINGS_KEYS)))
        bad += valuation + selection + Guards.problems_of(self.settings_values(Guards),
                                                          SETTINGS_KEYS)
        if params is not None and not valuation and self.clients_per_round >= 1:
            bad += self._valuation_problems(params)
        if not selection and (spec := registry.SELECTORS.get(self.selection)) is not None:
            bad += spec.settings(**self.settings_values(spec.settings)).round_problems(
                self.clients_per_round, {**SETTINGS_KEYS, "clients_per_round": "clients-per-round"})
        return bad + _strategy_problems(self)

    def model_problems(self, state: Mapping[str, Any], num_classes: int) -> list[str]:
        """The selector's problems with the run's model (its arrays by name, in order) on
        ``num_classes`` classes, checked before the first round (:meth:`~fedowen_strategy.
        selectors.base.SelectorSettings.model_problems`); none for a strategy that does not
        select."""
        spec = registry.SELECTORS.get(self.selection)
        if self.strategy != "fedowen" or spec is None:
            return []
        return spec.settings(**self.settings_values(spec.settings)).model_problems(
            state, num_classes, SETTINGS_KEYS)

    def _server_problems(self) -> list[str]:
        """The cross-key rules of the keys no library settings type owns (each key's own rule
        is in its declaration: :func:`fedowen_task.declare.rule_problems`)."""
        return (one_of("utility-metric", self.utility_metric, UTILITY_METRICS)
                + selection_problems(self.valuation, self.selection, SETTINGS_KEYS))

    def federation_config(self) -> dict[str, Any]:
        """The keys that shape the model and the federation (kebab-case), recorded in every
        checkpoint: all but :data:`OPERATIONAL_KEYS`, which a resume may change."""
        return {f.name.replace("_", "-"): getattr(self, f.name) for f in fields(self)
                if f.name.replace("_", "-") not in OPERATIONAL_KEYS}

    def _valuation_problems(self, params: dict[str, Any]) -> list[str]:
        """Of valid valuation settings: the first-order terms' utility metric, the estimator's
        parameters and its minimum budget for every possible n <= k."""
        spec = ESTIMATORS.get(self.valuation)
        if (spec is not None and spec.uses_first_order and self.utility_metric != "neg-loss"
                and self.utility_metric in UTILITY_METRICS):
            return [f"valuation={self.valuation!r} uses the first-order terms of the delta game "
                    "with neg-loss (one gradient of the evaluation loss): set utility-metric = "
                    f"\"neg-loss\" (got utility-metric={self.utility_metric!r})"]
        if self.valuation not in GAME_METHODS or self.owen_q < 1:
            return []
        for n in range(1, self.clients_per_round + 1):
            budget = round_budget(self.valuation, n, self.budget_m)
            found = estimate_problems(self.valuation, n, budget, params)
            if found:
                hint = (f" (budget = returned updates x budget-m={self.budget_m}: raise "
                        "budget-m)")
                return [f"valuation={self.valuation!r}: {p}"
                        f"{hint if p.startswith('budget=') else ''}" for p in found]
        return []


def output_root() -> Path:
    """Where runs without an ``output-dir`` go: ``$FEDOWEN_OUTPUT``, else ``~/fedowen-runs``."""
    return Path(os.environ.get("FEDOWEN_OUTPUT") or Path.home() / "fedowen-runs")


def _strategy_problems(cfg: RunConfig) -> list[str]:
    from server_app.strategies import strategy_problems  # imports flwr

    return strategy_problems(cfg)


def parse_run_config(run_config: Mapping[str, Any]) -> RunConfig:
    """Validate Flower's run config and freeze it.

    Raises
    ------
    fedowen_task.config.ConfigError
        (a ValueError) listing every unknown key, ill-typed value, out-of-range value and
        broken cross-key rule at once.
    """
    return parse_config(RunConfig, run_config)


__all__ = ["ConfigError", "RunConfig", "parse_params", "parse_run_config"]
