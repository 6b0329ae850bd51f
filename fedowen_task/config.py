"""The run configuration's schema, shared by the ServerApp, the ClientApp and ``sim``.

Every key of ``[tool.flwr.app.config]`` (kebab-case) is one field of a frozen dataclass
(snake_case). :class:`TaskConfig` holds the keys a ClientApp reads (data, partition, local
training, simulated adversaries); ``server_app.config.RunConfig`` extends it with the server's
keys, so each key has one owner. :func:`parse_config` checks every key at once: unknown keys
(with the closest valid name), types, then each dataclass's ``problems()`` (ranges and
cross-key rules), and raises one :class:`ConfigError` listing everything that is wrong.

A ClientApp parses with ``strict=False``: it reads only its own keys and ignores the rest,
so a server-side key (or a user's own key) never breaks a client.
"""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Self, TypeVar

from fedowen_task.adversary.keys import KNOWS, AdversaryConfig, Trigger
from fedowen_task.declare import (
    ABSOLUTE_PATH,
    above,
    at_least,
    declared,
    finite,
    key,
    owned,
    rule_problems,
    within,
)
from fedowen_task.recipe import RecipeKeys, TrainConfig, keys_problems

_TYPES = {"int": int, "float": float, "str": str, "bool": bool}
_RECIPE_KEYS = {f.name: f.name.replace("_", "-") for f in fields(RecipeKeys)}


class ConfigError(ValueError):
    """An invalid run config; ``problems`` lists every problem found."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid run config ({len(self.problems)} problem"
                         f"{'s' if len(self.problems) != 1 else ''}):\n{lines}")


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, else an empty string."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def one_of(key: str, value: str, choices: Sequence[str]) -> list[str]:
    """A problem unless ``value`` is one of ``choices`` (with the closest choice suggested)."""
    if value in choices:
        return []
    return [f"{key}={value!r} is not one of {', '.join(choices)}{did_you_mean(value, choices)}"]


@dataclass(frozen=True)
class _DataKeys:
    """The data, partition and local-training keys."""

    dataset: str = key("mnist", "mnist | fashion-mnist | cifar10 | femnist | medmnist[:flag]")
    model: str = key("auto", "lenet | cnn | resnet18 | resnet18-gn (GroupNorm) | module:factory;"
                     " auto: resnet18 for cifar10, else lenet")
    data_dir: str = key("", "where the data is (empty: $FEDOWEN_DATA, else "
                        "~/.cache/fedowen/data)", rule=ABSOLUTE_PATH)
    download: bool = key(False, "fetch a missing dataset (needs internet)")
    alpha: float = key(0.1, "the Dirichlet split's alpha", rule=above(0))
    imbalance_factor: float = key(0.01, "long-tail imbalance factor (0: the data's own counts)",
                                  rule=within(0, 1, note=" (0 = the data's own class counts, "
                                              "no long-tailed transform)"))
    partition_scheme: str = key("per-class", "per-class | per-client | writer | writer-sample")
    min_partition_size: int = key(10, "the least examples a client holds", rule=at_least(0))
    eval_fraction: float = key(0.01, "the server's evaluation share of the training data",
                               rule=within(0, 1, closed="()"))
    validation_fraction: float = key(0.0, "a validation set's share (0: none)")
    seed: int = key(0, "the run's seed")
    # the local-training recipe's keys (fedowen_task.recipe declares them)
    lr: float = owned(RecipeKeys, "lr")
    momentum: float = owned(RecipeKeys, "momentum")
    batch_size: int = owned(RecipeKeys, "batch_size")
    local_epochs: int = owned(RecipeKeys, "local_epochs")
    weight_decay: float = owned(RecipeKeys, "weight_decay")
    client_max_samples: int = key(0, "a cap on each client's examples (0: none)",
                                  rule=at_least(0, " (0 = no cap)"))
    device: str = key("auto", "where to train, value and evaluate: auto | cpu | cuda | cuda:N")


@dataclass(frozen=True)
class _AdversaryKeys:
    """The ``adversary-*`` run-config keys (each declared once: :mod:`fedowen_task.declare`)."""

    adversary_fraction: float = key(0.0, "the share of clients that attack", rule=within(0, 1))
    adversary_kind: str = key("label-flip", "the attack (fedowen_task/adversary/attacks.py)")
    adversary_noise_std: float = key(0.05, "the noise attack's standard deviation",
                                     rule=at_least(0))
    adversary_sybil_noise: float = key(0.1, "colluding Sybils' noise, relative to their update",
                                       rule=at_least(0))
    adversary_boost: float = key(2.5, "the boosted (and backdoor) update's scale",
                                 rule=above(0))
    adversary_alie_z: float = key(0.0, "ALIE's z (0: z_max)", rule=finite(at_least(
        0, " (0 = Baruch et al.'s z_max from the round's replies and attackers)")))
    adversary_ipm_epsilon: float = key(0.5, "IPM's epsilon", rule=finite(above(0)))
    adversary_jitter: float = key(0.0, "noise on ALIE's and IPM's vectors (0: copies)",
                                  rule=finite(at_least(0, " (0: the papers' identical vectors)")))
    adversary_trigger: str = key("square", "the backdoor's trigger: square | plus | bars "
                                 "(DBA's)")
    adversary_trigger_size: int = key(3, "the trigger's side (bars: a bar's length), in "
                                      "pixels")
    adversary_trigger_position: str = key("bottom-right", "bottom-right | top-left | center")
    adversary_target: int = key(0, "the backdoor's target class")
    adversary_poison_fraction: float = key(0.5, "the share of the attacker's images stamped")
    adversary_statistics_scale: float = key(4.0, "scaled-statistics' factor on its running "
                                            "statistics", rule=finite(above(0)))
    adversary_dba_parts: int = key(4, "the bars trigger's bars (DBA's local triggers)")
    adversary_dba_gap: int = key(2, "pixels between the bars trigger's bars")
    adversary_neurotoxin_top: float = key(
        0.05, "neurotoxin: the share of coordinates it leaves alone (the largest of the last "
        "global change)", rule=within(0, 1, closed="[)", note=" (0: none, a plain backdoor)"))
    adversary_knows: str = key(
        "bounds", "what adaptive-backdoor shapes its update to pass: bounds (the norm bound "
        "and the honest cone) | defences (also the run's defence list, simulated on the round)")

    def adversary_problems(self) -> list[str]:
        """The backdoor trigger's problems (:class:`Trigger` owns them; the other keys' rules
        are declared with them, the kind is checked against the table by
        :meth:`fedowen_task.config.TaskConfig.problems`)."""
        trigger = Trigger(self.adversary_trigger, self.adversary_trigger_size,
                          self.adversary_trigger_position, self.adversary_target,
                          self.adversary_poison_fraction, self.adversary_dba_parts,
                          self.adversary_dba_gap)
        return trigger.problems() + one_of("adversary-knows", self.adversary_knows, KNOWS)


# Bases list their fields last base first: the data keys, then the adversary-* keys
# (fedowen_task.adversary.keys), the order of pyproject.toml and of every config.json.
@dataclass(frozen=True)
class TaskConfig(_AdversaryKeys, _DataKeys):
    """The keys a ClientApp reads (each declared once: :mod:`fedowen_task.declare`)."""

    def adversary(self) -> AdversaryConfig:
        """The run's simulated adversaries (:mod:`fedowen_task.adversary`)."""
        return AdversaryConfig.of(self, self.seed)

    def model_name(self) -> str:
        """``model = "auto"``: ResNet-18 for CIFAR-10, LeNet otherwise (as in the paper).
        BatchNorm's ResNet-18 over ResNet-18-GN for CIFAR-10 by conf/backbone-dev.toml's rule:
        validation accuracy 12.98% against 10.41% at each one's picked lr (8 rounds, seeds 0-2,
        docs/results/backbone-dev/decision.md)."""
        if self.model != "auto":
            return self.model
        return "resnet18" if self.dataset == "cifar10" else "lenet"

    def train_config(self) -> TrainConfig:
        """The local-training recipe the run trains with, resolved here alone: the model
        (``auto`` as :meth:`model_name` says), its recipe
        (:func:`fedowen_task.models.model_recipe`), and over it every recipe key that is set
        (:meth:`fedowen_task.recipe.RecipeKeys.over`; a key at its "not set" value leaves the
        model's field)."""
        from fedowen_task.models import model_recipe  # imports torch: only when training

        keys = RecipeKeys(**{f.name: getattr(self, f.name) for f in fields(RecipeKeys)})
        return keys.over(model_recipe(self.model_name()))

    def with_recipe(self) -> Self:
        """These keys with the recipe's in place of each "not set" value: what
        :func:`parse_config` returns, so ``config.json`` records the recipe the run trains
        with (and a cell's record compares with today's as it ran: ``sim.results``)."""
        return replace(self, **asdict(self.train_config()))

    def problems(self) -> list[str]:
        """Out-of-range values of the task keys."""
        from fedowen_task.adversary.attacks import (  # imports torch: only when validating
            kinds,
            trigger_problems,
        )
        from fedowen_task.data import DATASETS
        from fedowen_task.device import device_problems
        from fedowen_task.models import MODELS, model_problems
        from fedowen_task.partition import SCHEMES

        checks = [
            (not 0 < self.eval_fraction < 1  # that is eval-fraction's problem
             or 0 <= self.validation_fraction < 1 - self.eval_fraction,
             f"validation-fraction={self.validation_fraction} must lie in [0, 1 - eval-fraction) "
             "(0 = no validation set)"),
        ]
        bad = [message for ok, message in checks if not ok] + rule_problems(self)
        bad += self.adversary_problems()
        bad += keys_problems(self, _RECIPE_KEYS)
        bad += one_of("dataset", self.dataset.split(":", 1)[0], DATASETS)
        bad += (model_problems(self.model) if ":" in self.model  # a user's module:factory
                else one_of("model", self.model, ("auto", *MODELS)))
        if not bad:  # the model's own recipe (a user's factory may declare a bad one)
            bad += recipe_problems_of(self)
        bad += device_problems(self.device)
        bad += one_of("partition-scheme", self.partition_scheme, SCHEMES)
        bad += one_of("adversary-kind", self.adversary_kind, kinds())
        bad += trigger_problems(self.adversary_kind, self.adversary_trigger)
        return bad


def recipe_problems_of(cfg: TaskConfig) -> list[str]:
    """Why ``cfg``'s recipe cannot be resolved (a user's factory's declared recipe)."""
    try:
        cfg.train_config()
    except ValueError as err:
        return [str(err)]
    return []


C = TypeVar("C", bound=TaskConfig)


def _typed(key: str, value: Any, type_name: str) -> tuple[Any, str | None]:
    """``value`` as the field's type (an int is a valid float), or a problem."""
    expected = _TYPES[type_name]
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if expected is bool:
        return (value, None) if isinstance(value, bool) else (
            None, f"{key}={value!r} should be true or false")
    if isinstance(value, bool) or not isinstance(value, expected):
        return None, f"{key}={value!r} should be {expected.__name__}"
    return value, None


def parse_config(cls: type[C], run_config: Mapping[str, Any], *, strict: bool = True) -> C:
    """Validate ``run_config`` against ``cls`` and freeze it, the recipe's keys resolved
    (:meth:`TaskConfig.with_recipe`: each "not set" one holds the model's value).

    Parameters
    ----------
    cls : type
        :class:`TaskConfig` or a subclass with more keys.
    run_config : Mapping
        Flower's run config (kebab-case keys).
    strict : bool
        Unknown keys are problems (the ServerApp); ``False`` ignores them (a ClientApp).

    Raises
    ------
    ConfigError
        Listing every unknown key, ill-typed value and out-of-range value at once.
    """
    known = {k.name: k for k in declared(cls)}
    problems: list[str] = []
    values: dict[str, Any] = {}
    for name, raw in run_config.items():
        spec = known.get(name)
        if spec is None:
            if strict:
                problems.append(f"unknown key {name!r}{did_you_mean(name, list(known))}")
            continue
        value, problem = _typed(name, raw, spec.type)
        if problem:
            problems.append(problem)
        else:
            values[spec.field] = value
    if any("did you mean" not in p for p in problems if p.startswith("unknown key")):
        problems.append(f"valid keys: {', '.join(sorted(known))}")
    cfg = cls(**values)  # ill-typed keys keep their defaults, so the range checks still run
    problems += cfg.problems()
    if problems:
        raise ConfigError(problems)
    return cfg.with_recipe()


def parse_task_config(run_config: Mapping[str, Any]) -> TaskConfig:
    """The ClientApp's view: only the task keys, other keys ignored."""
    return parse_config(TaskConfig, run_config, strict=False)


def parse_scalar(raw: str) -> Any:
    """A ``key=value`` value from the command line: bool, int, float, else the string."""
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


def parse_params(text: str, key: str) -> dict[str, Any]:
    """``"a=1 b-c=x"`` -> ``{"a": 1, "b_c": "x"}`` (values parsed as bool/int/float/str);
    ``key`` names the run-config key in errors (``valuation-params``, ``strategy-params``)."""
    params: dict[str, Any] = {}
    for item in shlex.split(text):
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise ValueError(f"{key} item {item!r} is not key=value")
        params[name.replace("-", "_")] = parse_scalar(raw)
    return params
