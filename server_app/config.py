"""The run configuration, parsed once into a frozen, validated dataclass.

Every key of ``[tool.flwr.app.config]`` in pyproject.toml maps to one field here (kebab-case
key -> snake_case field). Unknown keys, wrong types and out-of-range values fail before any
round with one error that lists every problem.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from fedowen_strategy.bounds import UPDATE_BOUNDS
from fedowen_strategy.contribution import GAMES, METHODS, PHI_SCALES, resolve_axes
from fedowen_strategy.selection import MEMORIES, SelectionParams

SCHEMES = ("per-class", "per-client", "writer")
ADVERSARY_KINDS = ("label-flip", "noise", "free-rider", "sybil")
METRICS = ("accuracy", "neg-loss")


@dataclass(frozen=True)
class RunConfig:
    """FedOwen's run configuration (defaults match pyproject.toml)."""

    num_server_rounds: int = 100
    clients_per_round: int = 10
    dataset: str = "mnist"
    model: str = "auto"
    data_dir: str = ""
    output_dir: str = ""
    alpha: float = 0.1
    imbalance_factor: float = 0.01
    partition_scheme: str = "per-class"
    min_partition_size: int = 10
    eval_fraction: float = 0.01
    seed: int = 0
    lr: float = 0.02
    momentum: float = 0.9
    batch_size: int = 10
    local_epochs: int = 1
    weight_decay: float = 0.0
    client_max_samples: int = 0
    test_max_samples: int = 0
    valuation: str = "owen"
    valuation_params: str = ""
    selection: str = "auto"
    aggregation: str = "auto"
    budget_m: int = 4
    owen_q: int = 2
    utility_metric: str = "accuracy"
    game: str = "average"
    phi_scale: str = "l1"
    temperature: float = 1.0
    epsilon: float = 0.1
    ucb_c: float = 0.1
    tau: float = 0.0
    max_norm_ratio: float = 10.0
    # Robust update bounds (issue 14): see fedowen_strategy.bounds.
    update_bound: str = "reject"
    update_bound_multiple: float = 3.0
    round_timeout: float = 600.0
    node_wait_timeout: float = 15.0
    duplicate_tolerance: float = 0.05
    uniform_mix: float = 0.0
    weight_cap: float = 1.0
    bandit_memory: str = "latest"
    bandit_discount: float = 0.3
    torch_threads: int = 1
    resume_from: str = ""
    adversary_fraction: float = 0.0
    adversary_kind: str = "label-flip"
    adversary_noise_std: float = 0.05
    krum_malicious: int = 0
    device: str = "auto"

    def model_name(self) -> str:
        """``model = "auto"``: ResNet-18 for CIFAR-10, LeNet otherwise (as in the paper)."""
        if self.model != "auto":
            return self.model
        return "resnet18" if self.dataset == "cifar10" else "lenet"

    def axes(self) -> tuple[str, str]:
        """(selection, aggregation) with ``auto`` resolved for this valuation."""
        return resolve_axes(self.valuation, self.selection, self.aggregation)

    def selection_params(self) -> SelectionParams:
        """Algorithm 2's constants."""
        return SelectionParams(epsilon=self.epsilon, c=self.ucb_c, tau=self.tau)

    def estimator_params(self) -> dict[str, Any]:
        """Keyword parameters for the estimator, plus ``valuation-params``
        ("key=value key=value", values parsed as int/float/bool).

        ``owen-q`` is Q, the number of inclusion levels of the paper's Algorithm 1, and goes to
        ``owen-paper`` only: the default ``owen`` stratifies q with one stratum per sample
        (set ``valuation-params = "strata=2"`` to pin Q strata there)."""
        params: dict[str, Any] = {}
        if self.valuation == "owen-paper":
            params["levels"] = self.owen_q
        for item in shlex.split(self.valuation_params):
            key, sep, raw = item.partition("=")
            if not sep or not key:
                raise ValueError(f"valuation-params item {item!r} is not key=value")
            params[key.replace("-", "_")] = _parse_scalar(raw)
        return params

    def resolved_output_dir(self, run_id: int) -> Path:
        """``resume-from`` (a resumed run continues in place), else ``output-dir``, else
        ``$FEDOWEN_OUTPUT/run-<id>``, else ``~/fedowen-runs/run-<id>``."""
        if self.resume_from:
            return Path(self.resume_from)
        if self.output_dir:
            return Path(self.output_dir)
        root = os.environ.get("FEDOWEN_OUTPUT") or str(Path.home() / "fedowen-runs")
        return Path(root) / f"run-{run_id}"

    def federation_config(self) -> dict[str, Any]:
        """The keys that shape the model and the federation (kebab-case), recorded in every
        checkpoint: all but :data:`OPERATIONAL_KEYS`, which a resume may change."""
        return {f.name.replace("_", "-"): getattr(self, f.name) for f in fields(self)
                if f.name.replace("_", "-") not in OPERATIONAL_KEYS}


#: Run-config keys a resumed run may change: how long and where it runs, not what it learns.
OPERATIONAL_KEYS = frozenset({"num-server-rounds", "data-dir", "output-dir", "resume-from",
                              "device", "round-timeout", "node-wait-timeout", "torch-threads"})


def _parse_scalar(raw: str) -> Any:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


def _check_ranges(cfg: RunConfig) -> list[str]:
    bad = []
    checks = [
        (cfg.num_server_rounds >= 1, "num-server-rounds must be >= 1"),
        (cfg.clients_per_round >= 1, "clients-per-round must be >= 1"),
        (cfg.alpha > 0, "alpha must be > 0"),
        (0 < cfg.imbalance_factor <= 1, "imbalance-factor must lie in (0, 1]"),
        (cfg.partition_scheme in SCHEMES, f"partition-scheme must be one of {SCHEMES}"),
        (0 < cfg.eval_fraction < 1, "eval-fraction must lie in (0, 1)"),
        (cfg.lr > 0 and cfg.batch_size >= 1 and cfg.local_epochs >= 1,
         "lr must be > 0, batch-size and local-epochs >= 1"),
        (cfg.valuation in METHODS, f"valuation must be one of {', '.join(METHODS)}"),
        (cfg.budget_m >= 1 and cfg.owen_q >= 1, "budget-m and owen-q must be >= 1"),
        (cfg.utility_metric in METRICS, f"utility-metric must be one of {METRICS}"),
        (cfg.phi_scale in PHI_SCALES, f"phi-scale must be one of {PHI_SCALES}"),
        (cfg.game in GAMES, f"game must be one of {GAMES}"),
        (cfg.temperature > 0, "temperature must be > 0"),
        (cfg.round_timeout > 0, "round-timeout must be > 0"),
        (cfg.node_wait_timeout > 0, "node-wait-timeout must be > 0"),
        (0 <= cfg.duplicate_tolerance < 1, "duplicate-tolerance must lie in [0, 1)"),
        (0 <= cfg.uniform_mix <= 1, "uniform-mix must lie in [0, 1]"),
        (0 < cfg.weight_cap <= 1, "weight-cap must lie in (0, 1]"),
        (cfg.bandit_memory in MEMORIES, f"bandit-memory must be one of {MEMORIES}"),
        (0 < cfg.bandit_discount <= 1, "bandit-discount must lie in (0, 1]"),
        (cfg.torch_threads >= 0, "torch-threads must be >= 0 (0 = torch's default)"),
        # Robust update bounds (issue 14)
        (cfg.max_norm_ratio >= 0, "max-norm-ratio must be >= 0 (0 = off)"),
        (cfg.update_bound in UPDATE_BOUNDS, f"update-bound must be one of {UPDATE_BOUNDS}"),
        (cfg.update_bound_multiple > 1, "update-bound-multiple must be > 1 (e.g. 3)"),
        (cfg.data_dir == "" or os.path.isabs(cfg.data_dir), "data-dir must be absolute"),
        (cfg.output_dir == "" or os.path.isabs(cfg.output_dir), "output-dir must be absolute"),
        (0 <= cfg.adversary_fraction <= 1, "adversary-fraction must lie in [0, 1]"),
        (cfg.adversary_kind in ADVERSARY_KINDS,
         f"adversary-kind must be one of {ADVERSARY_KINDS}"),
        (cfg.adversary_noise_std >= 0, "adversary-noise-std must be >= 0"),
        (cfg.krum_malicious >= 0, "krum-malicious must be >= 0"),
        (cfg.resume_from == "" or os.path.isabs(cfg.resume_from), "resume-from must be absolute"),
    ]
    for ok, message in checks:
        if not ok:
            bad.append(message)
    for check in (cfg.selection_params, cfg.estimator_params, cfg.axes):
        try:
            check()
        except ValueError as err:
            bad.append(str(err))
    return bad


def parse_run_config(run_config: Mapping[str, Any]) -> RunConfig:
    """Validate Flower's run config and freeze it.

    Raises
    ------
    ValueError
        Listing every unknown key, ill-typed value and out-of-range value at once.
    """
    known = {f.name.replace("_", "-"): f for f in fields(RunConfig)}
    problems: list[str] = []
    values: dict[str, Any] = {}
    for key, value in run_config.items():
        spec = known.get(key)
        if spec is None:
            problems.append(f"unknown key {key!r}")
            continue
        expected = {"int": int, "float": float, "str": str}[str(spec.type)]
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, expected) or isinstance(value, bool):
            problems.append(f"{key}={value!r} should be {expected.__name__}")
            continue
        values[spec.name] = value
    if not problems:
        cfg = RunConfig(**values)
        problems = _check_ranges(cfg)
    if problems:
        valid = ", ".join(sorted(known))
        raise ValueError("invalid run config: " + "; ".join(problems) + f". Valid keys: {valid}")
    return cfg
