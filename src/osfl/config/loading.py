"""Loading a run's config: dataclass defaults <- YAML layers <- dotted overrides.

``osfl run CONFIG.yaml train.lr=0.01 partition.alpha=0.5``: each layer
overrides the previous one (docs/design.md §5); a file's ``base:`` names the
layers under it, the packaged default when it names none
(:mod:`osfl.config.layers`). Unknown keys at any level are
a :class:`~osfl.errors.ConfigError` that lists the valid keys of that level;
wrong types name the key and the value; a YAML syntax error names its line.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from osfl.config.hints import SHAPE_HINTS, valid_keys
from osfl.config.layers import NOTHING, PACKAGED, config_layers, pop_base
from osfl.config.schema import ExperimentConfig
from osfl.errors import ConfigError
from osfl.registry import did_you_mean
from osfl.safe_read import read_text


def _schema() -> DictConfig:
    return OmegaConf.structured(ExperimentConfig)


#: The most characters of a key a message quotes: a file that is not a
#: config (``osfl run /etc/passwd``) reads as one long key, never printed whole.
MAX_QUOTED = 60


def _short(text: str) -> str:
    return text if len(text) <= MAX_QUOTED else text[: MAX_QUOTED - 1] + "\u2026"


def _translate(e: OmegaConfBaseException, schema: DictConfig, source: str) -> ConfigError:
    key = getattr(e, "full_key", "") or ""
    if isinstance(e, ConfigKeyError | AttributeError) or "not in" in str(e):
        parent = key.rsplit(".", 1)[0] if "." in key else "top level"
        keys = valid_keys(schema, key)
        prefix = f"{parent}." if "." in key else ""
        hint = did_you_mean(key.rsplit(".", 1)[-1], keys, prefix)
        return ConfigError(
            f"unknown config key {_short(key)!r}{hint} ({source}); valid keys at {_short(parent)}: "
            f"{', '.join(keys) or '(none)'}"
        )
    if isinstance(e, ValidationError):
        first = str(e).splitlines()[0]
        hint = SHAPE_HINTS.get(key.split(".")[0]) if "." not in key else None
        if hint is not None:
            return ConfigError(f"bad value for {key!r} ({source}): {hint}")
        if "could not be converted" in first:
            value = getattr(e, "value", None)
            want = first.rsplit(" to ", 1)[-1]
            return ConfigError(
                f"bad value for {key!r} ({source}): {_short(repr(value))} is not a valid "
                f"{want.lower()}"
            )
        return ConfigError(f"bad value for {key!r} ({source}): {first[:200]}")
    return ConfigError(f"invalid configuration ({source}): {str(e).splitlines()[0][:200]}")


def default_config_text() -> str:
    """The embedded default experiment (``osfl/configs/default.yaml``)."""
    return resources.files("osfl").joinpath("configs/default.yaml").read_text()


#: The largest config file osfl reads (the packaged default is 2 KiB; a run's
#: resolved config.yaml about 6 KiB).
MAX_CONFIG_BYTES = 1 << 20
#: The deepest nesting of mappings and lists a config may have (osfl's own
#: nest five or six levels: ``method.kd.distill.lr``); deeper YAML made
#: OmegaConf recurse past Python's limit, a ``RecursionError`` traceback.
MAX_CONFIG_DEPTH = 32


#: PyYAML's event parser: libyaml's where PyYAML was built with it (fast),
#: else the pure-Python one.
_EVENTS = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _too_deep(text: str) -> bool | None:
    """Whether YAML ``text`` nests mappings or lists deeper than
    :data:`MAX_CONFIG_DEPTH` (``None``: it is not YAML), found before
    anything builds it: PyYAML's event parser is iterative, its composer
    (and OmegaConf) recursive."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=_EVENTS):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_CONFIG_DEPTH:
                    return True
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError as e:
        # PyYAML >= 6.0.4 bounds nesting itself (at 1000 levels, in the
        # scanner, before the events reach the count above): that is too deep
        # here as well, and the one-line refusal must not depend on the version.
        return True if "nesting depth" in str(e) else None
    return False


def _deep_error(source: str) -> ConfigError:
    return ConfigError(
        f"{source} nests mappings or lists more than {MAX_CONFIG_DEPTH} levels deep: "
        "not an osfl config"
    )


def _yaml_text(text: str, source: str) -> tuple[DictConfig, str]:
    if _too_deep(text):
        raise _deep_error(source)
    try:
        node = OmegaConf.create(text)
    except Exception as e:  # yaml.YAMLError and friends
        raise ConfigError(f"cannot parse {source}{yaml_error_where(e)}") from e
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{source} must hold a mapping of config keys at its top level")
    return node, source


def yaml_error_where(e: Exception) -> str:
    """``", line L, column C: problem (context at line L', column C')"`` of a
    YAML syntax error, in one line. PyYAML's own text spreads this over four
    lines and its first line is only the context ("while parsing a flow
    sequence"), without the position a user needs to find the mistake."""
    if not isinstance(e, yaml.MarkedYAMLError) or e.problem_mark is None:
        return f": {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    mark = e.problem_mark
    where = f", line {mark.line + 1}, column {mark.column + 1}: {e.problem}"
    if e.context:
        at = e.context_mark
        opened = f" at line {at.line + 1}, column {at.column + 1}" if at is not None else ""
        where += f" ({e.context}{opened})"
    return where


def _packaged_default() -> tuple[DictConfig, str]:
    """The packaged default's layer (its own ``base: none`` taken out)."""
    node, source = _yaml_text(default_config_text(), "embedded default.yaml")
    pop_base(node, source, NOTHING)
    return node, source


def _read_yaml(path: str | Path) -> tuple[DictConfig, str]:
    """One config file's layer, read through :mod:`osfl.safe_read` (a regular
    file of UTF-8 text, at most :data:`MAX_CONFIG_BYTES`)."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise ConfigError(f"config file not found: {p}{_not_found_hint(p)}")
    text = read_text(p, max_bytes=MAX_CONFIG_BYTES, what="config file", error=ConfigError)
    return _yaml_text(text, str(p))


def _not_found_hint(p: Path) -> str:
    """Where a relative config path was looked for, and the way out for the
    repository's ``configs/`` read from another directory."""
    hint = "" if p.is_absolute() else f" (relative to {Path.cwd()})"
    if p.name == "default.yaml":
        return hint + (
            "; a bare `osfl run` (no config file) runs the packaged default, configs/default.yaml"
        )
    if p.parts and p.parts[0] == "configs":
        return hint + "; configs/ is in the osfl checkout: run from its root or give the full path"
    return hint


def _parse_overrides(overrides: Sequence[str]) -> DictConfig:
    bad = [o for o in overrides if "=" not in o or o.startswith("=")]
    if bad:
        raise ConfigError(f"override {bad[0]!r} must look like key=value (e.g. train.lr=0.01)")
    for o in overrides:  # each value is parsed as YAML: bounded as a file is
        key, _, value = o.partition("=")
        if _too_deep(value):
            raise _deep_error(f"override {key}")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except (OmegaConfBaseException, yaml.YAMLError) as e:  # a value is parsed as YAML
        raise ConfigError(f"cannot parse overrides {list(overrides)}: {e}") from e


ConfigPaths = str | Path | Sequence[str | Path] | None


def config_layers_of(
    paths: ConfigPaths, *, embedded_default: bool = True
) -> list[tuple[DictConfig, str]]:
    """The YAML layers of ``paths`` (one file, several in order, or None: the
    embedded default, or nothing when not ``embedded_default``), bases first."""
    if paths is None:
        return [_packaged_default()] if embedded_default else []
    files = [paths] if isinstance(paths, str | Path) else list(paths)
    return config_layers([Path(p) for p in files], _read_yaml, _packaged_default)


def load_config(
    path: ConfigPaths = None, overrides: Sequence[str] = (), *, embedded_default: bool = True
) -> ExperimentConfig:
    """Defaults <- YAML layers (:func:`config_layers_of`) <- dotted overrides,
    validated into an ExperimentConfig."""
    return _merge(config_layers_of(path, embedded_default=embedded_default), overrides)


def load_config_text(text: str, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """Like :func:`load_config` for YAML given as text (e.g. in Flower's run
    config, usually a run's resolved config): its ``base`` may be ``default``
    or ``none`` (no file to be relative to), ``none`` when it names none, for
    the texts written before ``base`` existed."""
    node, source = _yaml_text(text, "YAML text")
    bases = pop_base(node, source, NOTHING)
    if set(bases) - {PACKAGED, NOTHING}:
        raise ConfigError(f"YAML text: base may only be {PACKAGED!r} or {NOTHING!r}; got {bases}")
    layers = [_packaged_default()] if PACKAGED in bases else []
    return _merge([*layers, (node, source)], overrides)


def _merge(layers: list[tuple[DictConfig, str]], overrides: Sequence[str]) -> ExperimentConfig:
    schema = _schema()
    if overrides:
        layers = [*layers, (_parse_overrides(overrides), "command-line overrides")]
    merged: DictConfig = schema
    for layer, source in layers:
        try:
            merged = OmegaConf.merge(merged, layer)  # type: ignore[assignment]
        except OmegaConfBaseException as e:
            raise _translate(e, schema, source) from e
    try:
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise _translate(e, schema, "merged config") from e
    except (TypeError, ValueError) as e:  # a dataclass __post_init__ refusing a value
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"invalid configuration: {e}") from e
    assert isinstance(cfg, ExperimentConfig)
    return cfg


@functools.cache
def default_partitions() -> tuple[dict[str, Any], ...]:
    """The ``partition`` a user who set none of it has: the packaged
    default's and the dataclass defaults' (a saved split,
    :mod:`osfl.data.saved_split`, refuses only options set to something else)."""
    bare = load_config(None, embedded_default=False).partition
    return tuple(dataclasses.asdict(p) for p in (load_config(None).partition, bare))


def to_yaml(cfg: ExperimentConfig) -> str:
    """The resolved config as YAML: ``osfl run`` on it reproduces the run. It
    holds every key, so it stands on nothing (``base: none``)."""
    return f"base: {NOTHING}\n" + OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: Any) -> dict[str, Any]:
    """A plain JSON-able dict of a (nested) config dataclass."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]
