"""The ServerApp's run configuration: the task keys plus the server's, validated once.

Every key of ``[tool.flwr.app.config]`` in pyproject.toml maps to one field here or in
:class:`fedowen_task.config.TaskConfig` (the keys a ClientApp also reads). ``parse_run_config``
reports every problem at once, one per mistake: unknown keys with the closest valid name,
wrong types, out-of-range values and cross-key rules (the estimator's minimum budget for N x M
and the parameters it accepts, the strategy's parameters), before any message is sent.

The library's settings types (:class:`~fedowen_strategy.contribution.ValuationSettings`,
:class:`~fedowen_strategy.selection.SelectionParams`, :class:`~fedowen_strategy.guards.Guards`)
carry the defaults and own the rules of their keys; one table, :data:`SETTINGS_KEYS`, maps
their fields onto run-config keys both ways: the run config's values onto the settings, the
settings' problems back onto the keys a user wrote.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from fedowen_strategy.contribution import (
    DEFAULT_UTILITY_METRIC,
    UTILITY_METRICS,
    Choices,
    ValuationSettings,
    resolve_auto,
    selection_problems,
)
from fedowen_strategy.guards import Guards
from fedowen_strategy.nodes import NODE_WAIT_TIMEOUT, ROUND_TIMEOUT
from fedowen_strategy.round_valuers import GAME_METHODS, round_budget
from fedowen_strategy.selection import SelectionParams
from fedowen_strategy.settings import Settings
from fedowen_strategy.valuation import ESTIMATORS, estimate_problems
from fedowen_task.config import ConfigError, TaskConfig, one_of, parse_config, parse_params

#: The library's defaults, which are the app's: every FedOwen key below defaults to them.
_VALUATION, _SELECTION, _GUARDS = ValuationSettings(), SelectionParams(), Guards()
#: Each field of the library's settings types -> its run-config key: the one table that maps
#: the run config onto the settings and names the settings' problems by the keys a user wrote.
#: SelectionParams' ``low_gain_scale`` (Algorithm 2's 0.1) has no key.
SETTINGS_KEYS: Mapping[str, str] = MappingProxyType({
    # ValuationSettings
    "method": "valuation", "budget_m": "budget-m", "params": "valuation-params",
    "phi_scale": "phi-scale", "temperature": "temperature", "krum_malicious": "krum-malicious",
    "aggregation": "aggregation", "game": "game", "uniform_mix": "uniform-mix",
    "weight_cap": "weight-cap",
    # SelectionParams
    "epsilon": "epsilon", "c": "ucb-c", "tau": "tau", "memory": "bandit-memory",
    "discount": "bandit-discount", "link_memory": "link-memory", "poc_d": "poc-d",
    "oort_exploration_min": "oort-exploration-min", "reward": "selection-reward",
    "resolve_level": "selection-level", "cap": "selection-cap",
    # Guards
    "max_norm_ratio": "max-norm-ratio", "update_bound": "update-bound",
    "update_bound_multiple": "update-bound-multiple", "norm_cap": "norm-cap",
    "norm_cap_multiple": "norm-cap-multiple", "value_cap_multiple": "value-cap-multiple",
    "value_cap_mode": "value-cap-mode", "link_cosine": "link-cosine",
    "duplicate_tolerance": "duplicate-tolerance", "update_filter": "update-filter",
    "robust_lr_threshold": "robust-lr-threshold", "aggregate_noise": "aggregate-noise",
})
#: Run-config keys a resumed run may change: how long and where it runs, not what it learns.
OPERATIONAL_KEYS = frozenset({"num-server-rounds", "data-dir", "output-dir", "resume-from",
                              "device", "round-timeout", "node-wait-timeout", "torch-threads",
                              "valuation-workers", "eval-every", "max-stalled-rounds",
                              "download", "verbose"})


@dataclass(frozen=True)
class RunConfig(TaskConfig):
    """FedOwen's run configuration (defaults match pyproject.toml)."""

    num_server_rounds: int = 100
    clients_per_round: int = 10
    fraction_evaluate: float = 0.0
    output_dir: str = ""
    test_max_samples: int = 0
    # The central evaluation's schedule (server_app.evaluation.evaluated): it reads the model,
    # never changes it, so a run's training is the same at any value.
    eval_every: int = 1
    strategy: str = "fedowen"
    strategy_params: str = ""
    proximal_mu: float = 0.0
    valuation: str = _VALUATION.method
    valuation_params: str = ""
    selection: str = "auto"
    aggregation: str = "auto"
    budget_m: int = _VALUATION.budget_m
    owen_q: int = 2
    utility_metric: str = DEFAULT_UTILITY_METRIC
    game: str = _VALUATION.game
    phi_scale: str = _VALUATION.phi_scale
    temperature: float = _VALUATION.temperature
    epsilon: float = _SELECTION.epsilon
    ucb_c: float = _SELECTION.c
    tau: float = _SELECTION.tau
    max_norm_ratio: float = _GUARDS.max_norm_ratio
    # Robust update bounds (issue 14): see fedowen_strategy.bounds.
    update_bound: str = _GUARDS.update_bound
    update_bound_multiple: float = _GUARDS.update_bound_multiple
    # Norm normalisation and Sybil links (issue 26): see fedowen_strategy.bounds / links.
    norm_cap: str = _GUARDS.norm_cap
    norm_cap_multiple: float = _GUARDS.norm_cap_multiple
    value_cap_multiple: float = _GUARDS.value_cap_multiple
    value_cap_mode: str = _GUARDS.value_cap_mode
    link_cosine: float = _GUARDS.link_cosine
    round_timeout: float = ROUND_TIMEOUT
    verbose: bool = False
    node_wait_timeout: float = NODE_WAIT_TIMEOUT
    # A run that learns nothing stops (server_app.stall); 0 = never.
    max_stalled_rounds: int = 3
    duplicate_tolerance: float = _GUARDS.duplicate_tolerance
    update_filter: str = _GUARDS.update_filter
    robust_lr_threshold: int = _GUARDS.robust_lr_threshold
    aggregate_noise: float = _GUARDS.aggregate_noise
    uniform_mix: float = _VALUATION.uniform_mix
    weight_cap: float = _VALUATION.weight_cap
    bandit_memory: str = _SELECTION.memory
    bandit_discount: float = _SELECTION.discount
    link_memory: int = _SELECTION.link_memory
    # The field's selectors and the posterior selector (issue 43): fedowen_strategy.selectors.
    poc_d: int = _SELECTION.poc_d
    oort_exploration_min: float = _SELECTION.oort_exploration_min
    selection_reward: str = _SELECTION.reward
    selection_level: float = _SELECTION.resolve_level
    selection_cap: float = _SELECTION.cap
    torch_threads: int = 1
    valuation_workers: int = 1
    resume_from: str = ""
    krum_malicious: int = _VALUATION.krum_malicious
    # Peer defences (issue 17): see fedowen_strategy.peers.fltrust / foolsgold.
    fltrust_root_size: int = 0
    fltrust_root_epochs: int = 1
    fltrust_server_lr: float = 1.0
    foolsgold_kappa: float = 1.0

    def choices(self) -> Choices:
        """FedOwen's selection, aggregation and norm cap, ``auto`` resolved for this
        valuation by :func:`fedowen_strategy.contribution.resolve_auto` (the one place)."""
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
        """Algorithm 2's constants and the bandit's memory."""
        return SelectionParams(**self.settings_values(SelectionParams))

    def valuation_settings(self) -> ValuationSettings:
        """The estimator and aggregation these keys describe."""
        return ValuationSettings(**{**self.settings_values(ValuationSettings),
                                    "params": self.estimator_params()})

    def fedowen_arguments(self) -> dict[str, Any]:
        """The one mapping of the run config onto :class:`fedowen_strategy.FedOwen`'s
        arguments (the library's types, whose defaults are these keys' defaults)."""
        return {"clients_per_round": self.clients_per_round,
                "fraction_evaluate": self.fraction_evaluate,
                "valuation": self.valuation_settings(), "selection": self.selection,
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
        selection = SelectionParams.problems_of(self.settings_values(SelectionParams),
                                                SETTINGS_KEYS)
        bad += valuation + selection + Guards.problems_of(self.settings_values(Guards),
                                                          SETTINGS_KEYS)
        if params is not None and not valuation and self.clients_per_round >= 1:
            bad += self._valuation_problems(params)
        if (not selection and self.selection == "power-of-choice"
                and self.poc_d < self.clients_per_round):
            bad.append(f"poc-d={self.poc_d} must be >= clients-per-round="
                       f"{self.clients_per_round}: Power-of-Choice keeps k of d candidates")
        return bad + _strategy_problems(self)

    def _server_problems(self) -> list[str]:
        """The keys no library settings type owns."""
        checks = [
            (self.num_server_rounds >= 1, "num-server-rounds must be >= 1"),
            (self.clients_per_round >= 1, "clients-per-round must be >= 1"),
            (0 <= self.fraction_evaluate <= 1,
             f"fraction-evaluate={self.fraction_evaluate} must lie in [0, 1] (0 = off)"),
            (self.owen_q >= 1, f"owen-q={self.owen_q} must be >= 1"),
            (self.round_timeout > 0, "round-timeout must be > 0"),
            (self.node_wait_timeout > 0, "node-wait-timeout must be > 0"),
            (self.max_stalled_rounds >= 0,
             f"max-stalled-rounds={self.max_stalled_rounds} must be >= 0 (0: never stop a run "
             "that accepts no update)"),
            (self.torch_threads >= 0, "torch-threads must be >= 0 (0 = torch's default)"),
            (self.valuation_workers >= 0,
             f"valuation-workers={self.valuation_workers} must be >= 0 (1: the server's thread "
             "alone; 0: one per core the ServerApp may use)"),
            (self.test_max_samples >= 0, "test-max-samples must be >= 0 (0 = no cap)"),
            (self.eval_every >= 1,
             f"eval-every={self.eval_every} must be >= 1 (1: the test accuracy after every "
             "round)"),
            (self.output_dir == "" or os.path.isabs(self.output_dir),
             f"output-dir={self.output_dir!r} must be an absolute path"),
            (self.resume_from == "" or os.path.isabs(self.resume_from),
             f"resume-from={self.resume_from!r} must be an absolute path"),
            (self.proximal_mu >= 0, f"proximal-mu={self.proximal_mu} must be >= 0"),
            (self.fltrust_root_size >= 0,
             f"fltrust-root-size={self.fltrust_root_size} must be >= 0 (0 = the whole "
             "evaluation set)"),
            (self.fltrust_root_epochs >= 1,
             f"fltrust-root-epochs={self.fltrust_root_epochs} must be >= 1"),
            (math.isfinite(self.fltrust_server_lr) and self.fltrust_server_lr > 0,
             f"fltrust-server-lr={self.fltrust_server_lr} must be a finite number > 0 "
             "(FLTrust's global learning rate; 1 applies its aggregate as it is)"),
            (self.foolsgold_kappa > 0, f"foolsgold-kappa={self.foolsgold_kappa} must be > 0"),
        ]
        return ([message for ok, message in checks if not ok]
                + one_of("utility-metric", self.utility_metric, UTILITY_METRICS)
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
