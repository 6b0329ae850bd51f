"""The ServerApp's run configuration: the task keys plus the server's, validated once.

Every key of ``[tool.flwr.app.config]`` in pyproject.toml maps to one field of
:class:`RunConfig`, declared in :class:`server_app.server_keys.ServerKeys` (the server's keys)
or :class:`fedowen_task.config.TaskConfig` (the keys a ClientApp also reads). ``parse_run_config``
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
from fedowen_strategy.round.contribution import (
    UTILITY_METRICS,
    Choices,
    ValuationSettings,
    resolve_auto,
    selection_problems,
)
from fedowen_strategy.round.round_valuers import GAME_METHODS, round_budget
from fedowen_strategy.selectors import registry
from fedowen_strategy.selectors.base import SelectorSettings
from fedowen_strategy.selectors.shared import SelectionParams
from fedowen_strategy.settings import Settings
from fedowen_strategy.valuation import ESTIMATORS, estimate_problems
from fedowen_task.config import ConfigError, TaskConfig, one_of, parse_config, parse_params
from fedowen_task.declare import settings_keys
from server_app.server_keys import ServerKeys

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
class RunConfig(ServerKeys, TaskConfig):
    """FedOwen's run configuration: the task keys (:class:`~fedowen_task.config.TaskConfig`),
    then the server's (:class:`~server_app.server_keys.ServerKeys`), validated and mapped onto
    the library's settings."""

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
                "defences": self.defences, "seed": self.seed,
                "node_wait_timeout": self.node_wait_timeout, "query_timeout": self.round_timeout}

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
        select (``auto`` resolved)."""
        spec = registry.SELECTORS.get(self.choices().selection)
        if self.strategy != "fedowen" or spec is None:
            return []
        return spec.settings(**self.settings_values(spec.settings)).model_problems(
            state, num_classes, SETTINGS_KEYS)

    def _server_problems(self) -> list[str]:
        """The cross-key rules of the keys no library settings type owns (each key's own rule
        is in its declaration: :func:`fedowen_task.declare.rule_problems`)."""
        return (one_of("utility-metric", self.utility_metric, UTILITY_METRICS)
                + selection_problems(self.valuation, self.selection, SETTINGS_KEYS)
                + _defence_problems(self.defences)
                + _indicator_problems(self.dataset, self.indicator_ood))

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


def _defence_problems(defences: str) -> list[str]:
    from fedowen_strategy.defences.table import problems  # imports flwr

    return problems(defences)


def _indicator_problems(dataset: str, ood: str) -> list[str]:
    from server_app.indicator import ood_problems  # imports torch

    return ood_problems(dataset, ood)


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
