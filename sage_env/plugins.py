"""Plug-ins: algorithms, SDEs, rewards and backbones found by name in any installed package.

A package declares what it brings under four Python entry-point groups, as pytest and setuptools plug-ins do (a
``[project.entry-points."<group>"]`` table in its pyproject)::

    [project.entry-points."sage_grpo.algorithms"]
    my_grpo = "my_package.algorithm:MyGRPOConfig"

Every part of the library then finds it by that name with no import by the user: ``agents.make("my_grpo", ...)``,
``SageGRPOConfig(algorithm="my_grpo")``, ``sage-train --algorithm my_grpo``. This library registers its own
built-ins through the same groups in its own pyproject. A name may also be ``"package.module:attr"`` for quick
local use, without any packaging.

A plug-in is imported only when it is asked for: one that fails to import is an error naming its distribution then,
and never breaks the other names. Two distributions declaring one name in a group is an error naming both. Names
registered in this process (``agents.register``, ``sage_env.sde.register_sde``, ...) come first.

Each group is a `PluginGroup`: the kind of object its entry points load is checked by the group's ``check``.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from sage_env.checks import Check

__all__ = [
    "GROUPS",
    "OWN_DISTRIBUTION",
    "PluginError",
    "PluginGroup",
    "PluginName",
    "load_object",
    "own_names",
]

GROUPS = {
    "algorithms": "sage_grpo.algorithms",
    "sdes": "sage_grpo.sdes",
    "rewards": "sage_grpo.rewards",
    "backbones": "sage_grpo.backbones",
}
"""The entry-point group of each kind of plug-in."""


class PluginError(ValueError):
    """A plug-in name that is unknown, ambiguous, or whose code does not load."""


def load_object(reference: str, what: str) -> Any:
    """The object ``"package.module:attr"`` names (``attr`` may be dotted); a `PluginError` naming ``what``."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise PluginError(f"{what} {reference!r} is not of the form 'package.module:attr'.")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as error:
        raise PluginError(
            f"{what} {reference!r} cannot be imported: {type(error).__name__}: {error}."
        ) from error
    return target


class PluginGroup:
    """The plug-ins of one kind: registered in-process, declared by installed distributions, or ``module:attr``.

    Args:
        kind: what the plug-ins are, for messages ("algorithm", "SDE", ...).
        group: the entry-point group (`GROUPS`).
        check: ``check(obj, name) -> value`` turns what an entry point loads into what the registry holds, raising
            ``TypeError`` or ``ValueError`` when it is not of the kind (the message is wrapped with the source).
        registered: the dict that holds the names registered in this process (a module's own registry).
    """

    def __init__(
        self,
        kind: str,
        group: str,
        check: Callable[[Any, str], Any],
        registered: dict[str, Any] | None = None,
    ) -> None:
        self.kind, self.group, self.check = kind, group, check
        self._registered: dict[str, Any] = registered if registered is not None else {}
        self._loaded: dict[str, Any] = {}
        self._scanned: tuple[tuple[str, ...], dict[str, list[metadata.EntryPoint]]] | None = None

    # -- names -----------------------------------------------------------------------------------

    def _entry_points(self) -> dict[str, list[metadata.EntryPoint]]:
        """The group's entry points by name; scanned again when ``sys.path`` changes (a package made importable)."""
        key = tuple(sys.path)
        if self._scanned is None or self._scanned[0] != key:
            declared: dict[str, list[metadata.EntryPoint]] = {}
            for entry_point in metadata.entry_points(group=self.group):
                declared.setdefault(entry_point.name, []).append(entry_point)
            self._scanned = (key, declared)
        return self._scanned[1]

    def names(self) -> list[str]:
        """Every name: registered in this process and declared by installed distributions (none is imported)."""
        return sorted(set(self._registered) | set(self._entry_points()))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._registered or name in self._entry_points())

    # -- loading ---------------------------------------------------------------------------------

    def register(self, name: str, value: Any, *, overwrite: bool = False) -> None:
        """Register ``value`` under ``name`` in this process (it takes precedence over entry points)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} names must be non-empty strings, got {name!r}.")
        if name in self._registered and not overwrite and self._registered[name] is not value:
            raise ValueError(f"A {self.kind} named {name!r} is already registered; pass overwrite=True.")
        self._registered[name] = value

    def registered(self) -> dict[str, Any]:
        """The values registered in this process, by name."""
        return dict(self._registered)

    def load(self, name: str) -> Any:
        """The plug-in ``name``: registered, else an installed distribution's entry point, else ``module:attr``.

        Raises `PluginError` for an unknown name (listing the known ones), a name two distributions declare, or a
        plug-in whose code does not import or is not of this kind.
        """
        if not isinstance(name, str) or not name:
            raise PluginError(f"A {self.kind} name must be a non-empty string, got {name!r}.")
        if name in self._registered:
            return self._registered[name]
        if name not in self._loaded:
            self._loaded[name] = self._load_new(name)
        return self._loaded[name]

    def _load_new(self, name: str) -> Any:
        declared = self._entry_points().get(name, [])
        if len(declared) > 1:
            owners = sorted(_distribution(e) for e in declared)
            raise PluginError(
                f"The {self.kind} {name!r} is declared by {len(owners)} installed distributions ({', '.join(owners)}) "
                f"in the entry-point group {self.group!r}; uninstall one, or name the object as 'module:attr'."
            )
        if declared:
            entry_point = declared[0]
            source = f"{entry_point.value} (from the distribution {_distribution(entry_point)})"
            try:
                loaded = entry_point.load()
            # a plug-in's import may fail any way: report it, naming its distribution
            except Exception as error:
                raise PluginError(
                    f"The {self.kind} {name!r} could not be loaded from {source}: {type(error).__name__}: {error}."
                ) from error
        elif ":" in name:
            source, loaded = name, load_object(name, self.kind)
        else:
            close = difflib.get_close_matches(name, self.names(), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise PluginError(
                f"Unknown {self.kind} {name!r}; known: {', '.join(self.names()) or 'none'}.{hint} Install a package "
                f"that declares it in the entry-point group {self.group!r}, or name it as 'package.module:attr'."
            )
        return self._checked(loaded, name, source)

    def _checked(self, loaded: Any, name: str, source: str) -> Any:
        try:
            return self.check(loaded, name)
        except (TypeError, ValueError) as error:
            raise PluginError(f"The {self.kind} {name!r} from {source} is not usable: {error}") from error


OWN_DISTRIBUTION = "sage-grpo"
"""This library's distribution, whose pyproject declares the built-in plug-ins."""


def own_names(kind: str) -> tuple[str, ...]:
    """The names this library's own pyproject declares in the group of ``kind`` (its built-ins), as declared."""
    try:
        declared = metadata.distribution(OWN_DISTRIBUTION).entry_points
    except metadata.PackageNotFoundError:
        raise PluginError(
            f"{OWN_DISTRIBUTION} is not installed, so its built-in plug-ins (declared as entry points in its "
            "pyproject) cannot be found: install it, e.g. pip install -e . in its checkout."
        ) from None
    return tuple(entry_point.name for entry_point in declared.select(group=GROUPS[kind]))


@dataclass(frozen=True)
class PluginName(Check):
    """A config field naming a plug-in of ``group``: the name must load (a built-in, an installed package's, or
    ``module:attr``); the error is the group's, naming the known names or the plug-in's own failure."""

    group: PluginGroup | None = None
    optional: bool = False

    def describe(self) -> str:
        names = ", ".join(self.group.names()) if self.group is not None else ""
        return f"the name of a {self.group.kind if self.group else 'plug-in'} ({names})"

    def check(self, name: str, value: Any) -> None:
        if not isinstance(value, str) or not value:
            self.fail(name, value)
        try:
            self.group.load(value)
        except PluginError as error:
            raise PluginError(f"{name}: {error}") from error


def _distribution(entry_point: metadata.EntryPoint) -> str:
    dist = getattr(entry_point, "dist", None)
    return f"{dist.metadata['Name']} {dist.version}" if dist is not None else "an unknown distribution"
