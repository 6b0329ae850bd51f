"""What the run-config keys' declarations give beyond the parser: the pyproject check, the docs
table and the defaults' hash a cell's record names.

Every key is declared once (:mod:`fedowen_task.declare`); these read the declarations of
:class:`~server_app.config.RunConfig` (or of any subclass, so a key added by one field shows up
in each). ``python -m server_app.keys`` rewrites docs/keys.md from them.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedowen_task.declare import declared
from server_app.config import OPERATIONAL_KEYS, RunConfig

DOCS = Path(__file__).resolve().parents[1] / "docs" / "keys.md"


def defaults(cls: type = RunConfig) -> dict[str, Any]:
    """Every declared key -> its default, in declaration order."""
    return {k.name: k.default for k in declared(cls)}


def pyproject_problems(table: Mapping[str, Any], cls: type = RunConfig) -> list[str]:
    """How pyproject.toml's ``[tool.flwr.app.config]`` (``table``) differs from the
    declarations: keys missing, keys undeclared, defaults that differ (an int is a float)."""
    declared_defaults = defaults(cls)
    found = [f"{name} is declared but not in pyproject.toml (default {value!r})"
             for name, value in declared_defaults.items() if name not in table]
    for name, value in table.items():
        if name not in declared_defaults:
            found.append(f"{name} is in pyproject.toml but declared nowhere")
        elif (value != declared_defaults[name]
              or isinstance(value, bool) != isinstance(declared_defaults[name], bool)):
            found.append(f"{name} = {value!r} in pyproject.toml, {declared_defaults[name]!r} "
                         "declared")
    return found


def docs_table(cls: type = RunConfig) -> str:
    """docs/keys.md: one row per key (key, default, type, what it does)."""
    rows = [f"| `{k.name}` | `{json.dumps(k.default)}` | {k.type} | "
            f"{k.help.replace('|', chr(92) + '|')} |" for k in declared(cls)]
    return "\n".join([
        "# Run-config keys", "",
        "Generated from the keys' declarations (`python -m server_app.keys`): do not edit. "
        "How to add a key: [guide.md](guide.md#adding-a-key).", "",
        "| key | default | type | what it sets |", "|---|---|---|---|", *rows, ""])


def learning_defaults(cls: type = RunConfig) -> dict[str, Any]:
    """The defaults of the keys that shape what a run learns (all but
    :data:`~server_app.config.OPERATIONAL_KEYS`)."""
    return {name: value for name, value in defaults(cls).items()
            if name not in OPERATIONAL_KEYS}


def defaults_hash(cls: type = RunConfig) -> str:
    """12 hex digits of the SHA-256 of :func:`learning_defaults` (what a cell's record names)."""
    text = json.dumps(learning_defaults(cls), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def main(argv: list[str] | None = None) -> int:
    """Write docs/keys.md (``--check``: exit 1 when it is not current)."""
    text = docs_table()
    if argv is None:
        argv = sys.argv[1:]
    if "--check" in argv:
        return 0 if DOCS.read_text() == text else 1
    DOCS.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
