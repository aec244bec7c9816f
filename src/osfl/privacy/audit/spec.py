"""What a privacy audit records and scores: the config's ``audit`` list,
parsed and checked before anything runs (:func:`parse_audit`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from osfl.errors import ConfigError
from osfl.privacy import ATTACKS
from osfl.privacy.label_recovery import make_config


@dataclass(frozen=True)
class AttackSpec:
    """One attack to score: registered ``name``, its options, a column ``label``."""

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""

    @property
    def key(self) -> str:
        return self.label or self.name


@dataclass(frozen=True)
class AuditSpec:
    """What an audit records and scores (from the config's ``audit`` list).

    ``clients`` / ``rounds``: which to record (``None``: all; negative rounds
    count from the end, ``-1`` = the last). ``aux_per_class``: auxiliary images
    per class from the test split (the paper's 100; fewer where a class has
    fewer), drawn with ``aux_seed``. ``device``: where attacks run (``None``:
    the run's device). ``save``: write the observations into the run directory
    (``osfl audit`` needs them).
    """

    attacks: tuple[AttackSpec, ...] = ()
    clients: tuple[int, ...] | None = None
    rounds: tuple[int, ...] | None = None
    aux_per_class: int = 100
    aux_seed: int = 0
    device: str | None = None
    save: bool = True

    def __post_init__(self) -> None:
        if self.aux_per_class < 1:
            raise ConfigError(f"audit aux_per_class must be >= 1, got {self.aux_per_class}")


_OPTION_FIELDS = ("clients", "rounds", "aux_per_class", "aux_seed", "device", "save")


def parse_audit(items: Sequence[Any] | None) -> AuditSpec | None:
    """The config's ``audit`` list -> :class:`AuditSpec` (``None`` when empty).

    Items: an attack name (``rlu``, ``llg+``, ...); ``record`` (record only,
    score later with ``osfl audit``); ``{attack: rlu, label: rlu-m, <option>:
    ...}`` (attack options, e.g. ``num_samples``); ``{options: {clients: [0],
    rounds: [0, -1], aux_per_class: 20}}``. Unknown attacks or options raise
    :class:`ConfigError` before anything runs.
    """
    if not items:
        return None
    attacks: list[AttackSpec] = []
    opts: dict[str, Any] = {}
    for item in items:
        if isinstance(item, Mapping) and set(item) == {"options"}:
            opts.update(dict(item["options"]))
        else:
            attacks += _attacks_of(item)
    _check_attacks(attacks)
    return AuditSpec(attacks=tuple(attacks), **_checked_options(opts))


def _attacks_of(item: Any) -> list[AttackSpec]:
    """The attack an item names (none for ``record``, which only records)."""
    if isinstance(item, str):
        return [] if item.lower() == "record" else [AttackSpec(item.lower())]
    if isinstance(item, Mapping) and "attack" in item:
        extra = {k: v for k, v in item.items() if k not in ("attack", "label")}
        return [AttackSpec(str(item["attack"]).lower(), extra, str(item.get("label", "")))]
    raise ConfigError(
        f"audit item {item!r} is not an attack name, 'record', "
        "{attack: NAME, ...options} or {options: {...}}"
    )


def _check_attacks(attacks: Sequence[AttackSpec]) -> None:
    """Refuse an unknown attack or option, and two attacks under one column
    key, before anything runs."""
    for a in attacks:
        make_config(ATTACKS.get(a.name), dict(a.options))  # unknown name/option -> ConfigError
    keys = [a.key for a in attacks]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"audit lists an attack twice ({keys}); give one a distinct label")


def _checked_options(opts: dict[str, Any]) -> dict[str, Any]:
    """The audit options, unknown ones refused, ``clients`` / ``rounds`` as
    tuples of ints."""
    unknown = sorted(set(opts) - set(_OPTION_FIELDS))
    if unknown:
        raise ConfigError(
            f"unknown audit option(s) {', '.join(unknown)}; valid: {', '.join(_OPTION_FIELDS)}"
        )
    for k in ("clients", "rounds"):
        if opts.get(k) is not None:
            opts[k] = tuple(int(v) for v in opts[k])
    return opts
