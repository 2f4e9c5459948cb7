"""What a ``fix`` or ``migrate`` run was asked to do, as one frozen value.

The command line parses into it (``comfyquant.commands``), the API functions build it from
their keyword arguments, and ``run.run_fix`` / ``migration.run_migrate`` take it: an option is
a field here, a keyword of its API function and a flag of its command, and nothing between
them copies it by hand.  ``tests/test_options.py`` holds the three together.  The planner
takes its own part of it (``planner``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from .edits import Options

if TYPE_CHECKING:
    from ..checker.run import Targets
    from ..checkpoint import Paths


@dataclass(frozen=True, kw_only=True)
class RewriteOptions:
    """The options ``fix`` and ``migrate`` share (their API keywords of the same names)."""

    paths: Paths
    out: str | None = None
    in_place: bool = False
    target: Targets = "all"
    dry_run: bool = False
    allow_lossy: bool = False
    overwrite: bool = False

    def planner(self) -> Options:
        """What the repair planner decides with (``plan_repairs``)."""
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class FixOptions(RewriteOptions):
    """``comfyquant fix`` / ``comfyquant.fix``."""

    prefer: str | None = None
    convrot_groupsize: int | None = None
    reference: str | os.PathLike[str] | None = None
    max_error: float | None = None

    def planner(self) -> Options:
        return Options(self.target, self.prefer, self.convrot_groupsize, self.allow_lossy)


@dataclass(frozen=True, kw_only=True)
class MigrateOptions(RewriteOptions):
    """``comfyquant migrate`` / ``comfyquant.migrate``."""

    to: str | None = None

    def planner(self) -> Options:
        return Options(self.target, allow_lossy=self.allow_lossy, to=self.to)


class MigrateKeywords(TypedDict, total=False):
    """``migrate``'s keywords after ``paths`` and ``out``, for type checkers and IDEs
    (``**kwargs: Unpack[...]``): the fields of ``MigrateOptions``, whose defaults they take
    (``tests/test_options.py`` holds the two together)."""

    in_place: bool
    target: Targets
    dry_run: bool
    allow_lossy: bool
    overwrite: bool
    to: str | None
