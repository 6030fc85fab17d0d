"""``[families.<name>]``: which fixes an operator asks about together.

A family is declared once at the top level (its title) and each member names it with
``family = "<name>"`` on its ``[[fixes]]`` entry, so a new member is one line on its own
entry. A fix naming an undeclared family, or a family with no member, is refused: a typo
would otherwise drop a fix from the family's answer without a word.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from difflab.errors import ConfigError
from difflab.matrix.model import Family, Fix

_NAME = re.compile(r"[a-z][a-z0-9-]*")


def load_families(path: Path, raw: Any, fixes: tuple[Fix, ...]) -> dict[str, Family]:
    """Validate the ``[families]`` tables against the fixes that name them."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: families: expected a table of [families.<name>] tables")
    titles = {name: _title(f"{path}: families.{name}", name, table) for name, table in raw.items()}
    for fix in fixes:
        if fix.family is not None and fix.family not in titles:
            known = ", ".join(sorted(titles)) or "none declared"
            raise ConfigError(
                f"{path}: fix {fix.id!r}.family: {fix.family!r} is not a declared [families] table (known: {known})"
            )
    families = {}
    for name, title in titles.items():
        members = tuple(f.id for f in fixes if f.family == name)
        if not members:
            raise ConfigError(f"{path}: families.{name}: no fix names it (add family = {name!r} to its members)")
        families[name] = Family(name=name, title=title, members=members)
    return families


def _title(where: str, name: str, table: Any) -> str:
    if not _NAME.fullmatch(name):
        raise ConfigError(f"{where}: {name!r}: use lowercase letters, digits and '-'")
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table with a title")
    unknown = set(table) - {"title"}
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {sorted(unknown)}")
    title = table.get("title")
    if not isinstance(title, str) or not title.strip():
        raise ConfigError(f"{where}.title: expected a non-empty string")
    return title
