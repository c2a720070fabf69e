"""Reading configuration files as data: YAML without aliases, duplicate keys, deep nesting or environment blocks.

A config file may come from anywhere (a colleague, a paper's repository, the Hub), so reading one must not cost
more than its size nor change the process. `read_config_file`:

* refuses files over `MAX_CONFIG_BYTES`, anchors and aliases (a 436-byte "billion laughs" file expands to
  gigabytes), nesting deeper than `MAX_DEPTH` and duplicate keys (which YAML silently resolves to the last
  value): each is found in the event stream before anything is built, so a refusal costs one linear scan;
* refuses an ``env:`` block. TRL's parser copies such a block into the process environment, so a downloaded
  config could point a push at another endpoint (``HF_ENDPOINT``) or set a token; set variables in your shell;
* reads ``1e-4`` as a number, as YAML 1.2 does (PyYAML's YAML 1.1 would read it as the string ``"1e-4"``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

__all__ = ["MAX_CONFIG_BYTES", "MAX_DEPTH", "read_config_file"]

MAX_CONFIG_BYTES = 1 << 20
"""The largest config file read (1 MiB; the shipped configs are about 2 KB)."""
MAX_DEPTH = 16
"""The deepest nesting of mappings and lists accepted (a config is flat: field: value, or field: [values])."""

_FLOAT_1_2 = re.compile(r"^[-+]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)[eE][-+]?\d+$")


class _DuplicateKeyError(ValueError):
    """A mapping of the file names a key twice, or uses something other than a name as a key."""


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 exponent floats and duplicate keys refused."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise _DuplicateKeyError(
                    f"the key on line {key_node.start_mark.line + 1} is not a name ({key!r})"
                )
            if key in seen:
                raise _DuplicateKeyError(
                    f"the key {key!r} appears twice (line {key_node.start_mark.line + 1}); YAML would silently keep "
                    "the last value: keep one"
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_1_2, list("-+0123456789."))


def _check_events(text: str, source: str) -> None:
    """Refuse anchors, aliases and deep nesting from the event stream (nothing is composed yet)."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise ValueError(
                f"{source} uses a YAML anchor or alias (&name / *name), which config files may not: write each value "
                "out (aliases can expand a small file into gigabytes)."
            )
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise ValueError(
                    f"{source} nests deeper than {MAX_DEPTH} levels; a config is field: value pairs."
                )
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def read_config_file(path: str | os.PathLike, what: str = "config") -> dict[str, Any]:
    """The ``field: value`` mapping of a YAML config file, read as data (see the module docstring).

    Raises ``ValueError`` naming ``what`` and the path for a missing, oversized, unreadable or refused file.
    """
    path = Path(path)
    source = f"{what} {path}"
    if not path.is_file():
        raise ValueError(f"{source} does not exist (pass a YAML file).")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(
            f"{source} is {path.stat().st_size} bytes; config files are at most {MAX_CONFIG_BYTES} bytes."
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{source} is not a readable UTF-8 text file ({error}).") from error
    try:
        _check_events(text, source)
        values = yaml.load(text, Loader=_ConfigLoader)
    except yaml.YAMLError as error:
        raise ValueError(f"{source} is not valid YAML ({error}).") from error
    except _DuplicateKeyError as error:
        raise ValueError(f"{source}: {error}.") from None
    if values is None:
        return {}
    if not isinstance(values, dict) or not all(isinstance(key, str) for key in values):
        raise ValueError(f"{source} must hold a YAML mapping of field: value, got {type(values).__name__}.")
    if "env" in values:
        raise ValueError(
            f"{source} has an env: block. Config files are data and may not set environment variables (a downloaded "
            "config could redirect a push with HF_ENDPOINT or set HF_TOKEN); set them in your shell instead."
        )
    return values
