"""Options of one part of a run as its dataclass: a method's ``Config``
(``method.<name>.*``), its local-training recipe (``method_train.<name>.*``)
and the free-form option mappings (``defense``, ``byzantine``).

Each is merged onto its dataclass's schema so that an unknown key at any level
lists the valid keys of that level and a bad value names its dotted key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from osfl.config.hints import not_recipe_hint, renamed_key, valid_keys, where_instead
from osfl.errors import ConfigError
from osfl.fl.method import Method
from osfl.fl.train_config import TrainConfig
from osfl.registry import did_you_mean


def options_config(cls: type, spec: Mapping[str, Any], key: str) -> Any:
    """A free-form option mapping of the config (``defense: {...}``,
    ``byzantine: {...}``) as the dataclass ``cls``: unknown options are one
    ConfigError listing the valid ones (with a hint when YAML glued a colon
    to a key)."""
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(map(str, spec)) - set(valid))
    if unknown:
        hint = (
            f" (YAML needs a space after each colon: {key}={{name: value}}, or {key}.name=value)"
            if any(":" in k for k in unknown)
            else ""
        )
        raise ConfigError(
            f"unknown {key} option(s) {', '.join(unknown)}; valid: {', '.join(valid)}{hint}"
        )
    for f in dataclasses.fields(cls):  # an integer option given text: say what it must be
        value = spec.get(f.name)
        if f.type in (int, "int") and value is not None and not _is_int(value):
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:39] + "\u2026"
            raise ConfigError(f"{key}.{f.name} must be an integer, got {shown}")
    return cls(**dict(spec))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _merge_options(
    schema: DictConfig, overrides: Mapping[str, Any] | None, prefix: str, top: str
) -> Any:
    """``schema`` with ``overrides`` merged, as its dataclass. An unknown key at
    any level lists the valid keys of that level (``top`` says where a
    top-level key was unknown); a bad value names its dotted key under
    ``prefix``; the dataclass's own checks are prefixed too."""
    try:
        return OmegaConf.to_object(OmegaConf.merge(schema, dict(overrides or {})))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or ""
        if isinstance(e, ConfigKeyError | AttributeError) or "not in" in str(e):
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            where = f"in {prefix}.{parent}" if parent else top
            keys = valid_keys(schema, key)
            leaf = key.rsplit(".", 1)[-1]
            renamed = renamed_key(f"{prefix}.{parent}" if parent else prefix, leaf)
            if renamed is not None:
                raise ConfigError(renamed) from e
            hint = did_you_mean(leaf, keys)
            raise ConfigError(
                f"unknown option {leaf!r}{hint} {where}; valid: {', '.join(keys) or '(none)'}"
            ) from e
        raise ConfigError(f"{prefix}.{key}: {str(e).splitlines()[0]}") from e
    except (TypeError, ValueError) as e:  # ConfigError included: the dataclass's own checks
        # a check that names its key already (method.fens: ...) is not prefixed twice
        said = str(e)
        raise ConfigError(said if said.startswith(prefix) else f"{prefix}: {said}") from e


def method_config(method_cls: type[Method], overrides: Mapping[str, Any] | None = None) -> Any:
    """Build ``method_cls.Config`` with ``overrides`` (nested configs take nested
    mappings, e.g. ``{"distill": {"lr": 0.01}}``); an unknown key at any level
    lists the valid keys of that level, a bad value names its dotted key, and
    an unknown top-level key that the recipe or a nested group holds names
    the key to write instead (the recipe's only where the method trains with it)."""
    name = getattr(method_cls, "name", method_cls.__name__)
    schema = OmegaConf.structured(method_cls.Config)
    for key in map(str, overrides or {}):
        instead = (
            []
            if key in schema
            else where_instead(schema, name, key, recipe=method_cls.trains_with_recipe)
        )
        if instead:
            write = " or ".join(f"{k}=..." for k in instead)
            raise ConfigError(f"unknown option {key!r} for method {name!r}: write {write}")
    return _merge_options(schema, overrides, f"method.{name}", f"for method {name!r}")


def method_train_config(
    base: TrainConfig,
    overrides: Mapping[str, Any] | None,
    name: str,
    method_cls: type[Method] | None = None,
) -> TrainConfig:
    """``base`` with the user's ``method_train.<name>`` ``overrides`` on top
    (unknown keys and bad values name their dotted key
    ``method_train.<name>.<key>``). The precedence of the layers below is the
    assembly's (:func:`osfl.assembly.train_recipe`). Overrides for a
    ``method_cls`` that does not train with the recipe are refused, naming its
    own training knobs: recorded in ``train_sources`` and ignored, they would
    mislead."""
    if not overrides:
        return base
    if method_cls is not None and not method_cls.trains_with_recipe:
        raise ConfigError(not_recipe_hint(name, method_cls.Config))
    schema = OmegaConf.structured(base)
    return _merge_options(schema, overrides, f"method_train.{name}", f"in method_train.{name}")
