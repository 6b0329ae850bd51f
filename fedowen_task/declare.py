"""One declaration per run-config key: a dataclass field made by :func:`key`.

A key's name (kebab-case of the field, or ``name``), default, type (the field's annotation),
rule and one-line help live in that one field. Everything else reads them: the parser and
the problems list (:func:`fedowen_task.config.parse_config`, :func:`rule_problems`), the
ServerApp's mapping onto the library's settings (:func:`settings_keys`), the CLI's flags,
the pyproject check and the docs table (``server_app.keys``).

A key whose value a settings type owns (the library's ``ValuationSettings``,
``SelectionParams``, ``Guards``; the recipe's ``TrainConfig``) is declared on that type's
field, whose default is the library's and so the app's; the run config places it with
:func:`owned` (its position in ``config.json``), and the owner's ``problems()`` holds its rule.
Pure Python: the strategy library imports it as it imports the message protocol.
"""

from __future__ import annotations

import builtins
import dataclasses
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class Rule:
    """A one-key rule: ``ok(value)``, else the problem ``"<key>=<value> <text>"``."""

    ok: Callable[[Any], bool]
    text: str

    def problem(self, name: str, value: Any) -> str | None:
        """The problem ``value`` breaks, named by ``name``, or None."""
        return None if self.ok(value) else f"{name}={value!r} {self.text}"


def at_least(bound: float, note: str = "") -> Rule:
    """``value >= bound`` (``note``: what the bound means, in brackets after the rule)."""
    return Rule(lambda v: v >= bound, f"must be >= {bound}{note}")


def above(bound: float, note: str = "") -> Rule:
    """``value > bound``."""
    return Rule(lambda v: v > bound, f"must be > {bound}{note}")


def finite(rule: Rule) -> Rule:
    """``rule``, for finite numbers only (NaN and infinities fail)."""
    return Rule(lambda v: math.isfinite(v) and rule.ok(v),
                rule.text.replace("must be", "must be a finite number", 1))


def within(low: float, high: float, *, closed: str = "[]", note: str = "") -> Rule:
    """``value`` in the interval ``low``-``high``, each end closed or open as ``closed``
    (``"[]"``, ``"[)"``, ``"(]"``, ``"()"``) says."""
    def ok(v: Any) -> bool:
        lo = v >= low if closed[0] == "[" else v > low
        hi = v <= high if closed[1] == "]" else v < high
        return bool(lo and hi)

    return Rule(ok, f"must lie in {closed[0]}{low}, {high}{closed[1]}{note}")


ABSOLUTE_PATH = Rule(lambda v: v == "" or os.path.isabs(v), "must be an absolute path")


def key(default: Any, help: str, *, rule: Rule | None = None, name: str | None = None) -> Any:
    """A run-config key's one declaration, as a dataclass field.

    Parameters
    ----------
    default : bool, int, float or str
        The key's default (pyproject.toml's, checked by ``server_app.keys``).
    help : str
        One line for ``--help`` and the docs table.
    rule : Rule, optional
        A rule of this key alone (cross-key rules stay in the owner's ``problems()``).
    name : str, optional
        The run-config key when it is not the field's name in kebab-case (a library field).
    """
    return dataclasses.field(default=default,
                             metadata={"help": help, "rule": rule, "key": name})


def named(name: str) -> Any:
    """Metadata for a settings field another key feeds (``params`` <- ``valuation-params``):
    its problems are named ``name``; no declaration of its own."""
    return {"key": name}


def owned(owner: type, field: str) -> Any:
    """A run-config field for the key ``owner.field`` declares: its default and declaration,
    and the owner (whose ``problems()`` holds the key's rule)."""
    spec = next(f for f in dataclasses.fields(owner) if f.name == field)
    return dataclasses.field(default=spec.default,
                             metadata={**spec.metadata, "owner": owner, "rule": None})


@dataclass(frozen=True)
class Key:
    """A declared key, as read back from its field."""

    name: str
    field: str
    default: Any
    type: str
    help: str
    rule: Rule | None
    owner: builtins.type | None


def declared(cls: type) -> list[Key]:
    """The keys ``cls``'s fields declare, in field order (``config.json``'s)."""
    return [Key(name=f.metadata.get("key") or f.name.replace("_", "-"), field=f.name,
                default=f.default, type=str(f.type), help=f.metadata["help"],
                rule=f.metadata.get("rule"), owner=f.metadata.get("owner"))
            for f in dataclasses.fields(cls) if "help" in f.metadata]


def rule_problems(cfg: Any) -> list[str]:
    """What ``cfg`` breaks of its keys' own rules, one problem per key."""
    found = []
    for k in declared(type(cfg)):
        if k.rule is not None and (problem := k.rule.problem(k.name, getattr(cfg, k.field))):
            found.append(problem)
    return found


def settings_keys(owners: Iterable[type]) -> Mapping[str, str]:
    """Each field of the settings types ``owners`` -> the run-config key that feeds it.

    Raises
    ------
    ValueError
        When two owners' fields of one name are fed by different keys (one table maps field
        names onto keys: rename one of the fields).
    """
    table: dict[str, str] = {}
    where: dict[str, str] = {}
    for owner in owners:
        for f in dataclasses.fields(owner):
            if "help" not in f.metadata and "key" not in f.metadata:
                continue
            name = f.metadata.get("key") or f.name.replace("_", "-")
            if table.setdefault(f.name, name) != name:
                raise ValueError(f"{owner.__name__}.{f.name} (key {name!r}) and "
                                 f"{where[f.name]}.{f.name} (key {table[f.name]!r}) share a "
                                 "field name but not a key: rename one of the fields")
            where.setdefault(f.name, owner.__name__)
    return MappingProxyType(table)


def declarations(cls: type) -> dict[str, list[str]]:
    """Each key's declaration sites (``Class.field``) among ``cls``'s bases and the settings
    types it places keys of: a key declared twice (a field redeclared in a subclass, or a
    key a settings type declares declared again with :func:`key`) has two."""
    sites: dict[str, list[str]] = {}
    owners: dict[type, None] = {}  # in the order met, so the sites' order is stable
    for base in reversed(cls.__mro__):
        for name in vars(base).get("__annotations__", {}):
            spec = getattr(base, "__dataclass_fields__", {}).get(name)
            if spec is None or "help" not in spec.metadata:
                continue
            if spec.metadata.get("owner") is not None:
                owners[spec.metadata["owner"]] = None
                continue
            k = spec.metadata.get("key") or name.replace("_", "-")
            sites.setdefault(k, []).append(f"{base.__name__}.{name}")
    for owner in owners:
        for k in declared(owner):
            sites.setdefault(k.name, []).append(f"{owner.__name__}.{k.field}")
    return sites
