"""What the library's settings types share: each owns its rules.

A settings type (:class:`~fedowen_strategy.round.contribution.ValuationSettings`,
:class:`~fedowen_strategy.selectors.shared.SelectionParams` and each selector's settings,
:class:`~fedowen_strategy.defences.guard_settings.Guards`)
is a frozen dataclass with the app's defaults whose ``problems(keys)`` lists everything wrong
with it, one problem per mistake; constructing one raises ``ValueError`` with all of them.
A problem names a field as ``keys`` says (field name -> the name its user wrote): the field
itself by default (the keyword argument), the run config's key in the ServerApp, which renames
through one table (``server_app.config.SETTINGS_KEYS``) and checks a whole run config at once
with :meth:`Settings.problems_of`, without constructing anything.
"""

from __future__ import annotations

import dataclasses
import difflib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar

#: Field name -> the name a problem gives it; absent fields keep their own name.
Keys = Mapping[str, str]
NO_KEYS: Keys = MappingProxyType({})


def key(keys: Keys, field: str) -> str:
    """The name ``keys`` gives ``field`` (the field's own name by default)."""
    return keys.get(field, field)


def one_of(name: str, value: str, choices: Sequence[str]) -> list[str]:
    """A problem unless ``value`` is one of ``choices`` (the closest one suggested)."""
    if value in choices:
        return []
    close = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return [f"{name}={value!r} is not one of {', '.join(choices)}{hint}"]


class Settings(ABC):
    """Base of the frozen settings dataclasses: subclasses define :meth:`problems`."""

    __dataclass_fields__: ClassVar[dict[str, Any]]  # every subclass is a dataclass

    @abstractmethod
    def problems(self, keys: Keys = NO_KEYS) -> list[str]:
        """Everything wrong with these settings, one problem per mistake, fields named by
        ``keys``."""

    def __post_init__(self) -> None:
        if found := self.problems():
            raise ValueError(f"{type(self).__name__}: {'; '.join(found)}")

    @classmethod
    def problems_of(cls, values: Mapping[str, Any], keys: Keys = NO_KEYS) -> list[str]:
        """What ``cls(**values)`` would raise, as a list (fields named by ``keys``), without
        constructing it: missing fields take their defaults."""
        draft = object.__new__(cls)
        for spec in dataclasses.fields(cls):
            if spec.name in values:
                value = values[spec.name]
            elif spec.default_factory is not dataclasses.MISSING:
                value = spec.default_factory()
            else:
                value = spec.default
            object.__setattr__(draft, spec.name, value)
        return draft.problems(keys)
