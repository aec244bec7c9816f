"""Hints in config errors: where a mistyped or moved key now lives.

OmegaConf's own messages speak of ListConfig and AnyNode; these say what to
write instead: the shape of a list-valued key (``methods=[fedavg]``), the
``method_train.<name>`` key of an option that moved to the local-training
recipe, a nested group's key (``method.fafi.loss.tau``), a renamed key
(``autocast`` -> ``amp``), and a method's own training knobs where it does not
train with the shared recipe.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from osfl.config.options import default_of
from osfl.fl.optim import OptimConfig
from osfl.fl.train_config import TrainConfig


def valid_keys(schema: DictConfig, full_key: str) -> list[str]:
    """The keys of the schema node that holds ``full_key`` (for error messages)."""
    parent = full_key.rsplit(".", 1)[0] if "." in full_key else ""
    node = OmegaConf.select(schema, parent) if parent else schema
    return sorted(node.keys()) if isinstance(node, DictConfig) else []


#: Hints for keys a user is likely to mistype the shape of (OmegaConf's own
#: messages speak of ListConfig, AnyNode and Dict[str, Dict[str, Any]]).
SHAPE_HINTS = {
    "method": "`method` holds per-method options (method.fedavg.rounds=3); to choose the "
    "methods to run write methods=[fedavg] or methods=[fedavg,ensemble]",
    "methods": "methods is a list: write methods=[fedavg] or methods=[fedavg,ensemble]",
    "seeds": "seeds is a list: write seeds=[0] or seeds=[0,1,2]",
    "train_clients": "train_clients is a list of client ids: write train_clients=[0,1]",
    "audit": "audit is a list: write audit=[rlu] or audit=[rlu,llg+]",
    "logger": "logger is a list: write logger=[tensorboard] or logger=[tensorboard,wandb] "
    "(in YAML: logger: [tensorboard])",
    "sweep": 'sweep is a list: write "sweep=[partition.alpha=0.1,1.0]" or use --sweep',
    "defense": "defense is a mapping: write defense.sigma=0.05, or "
    '"defense={sigma: 0.05}" (YAML needs a space after each colon)',
}


#: Options that methods' Configs once held beside the local-training recipe,
#: and the ``method_train.<name>`` key that holds each now.
_RECIPE_RENAMES = {"local_epochs": "epochs", "epochs_per_step": "epochs"}


def _leaf_paths(node: Mapping[str, Any], leaf: str, prefix: str = "") -> list[str]:
    """The dotted paths below the top level of a config tree that end in ``leaf``."""
    out = []
    for k, v in node.items():
        if isinstance(v, Mapping):
            if leaf in v:
                out.append(f"{prefix}{k}.{leaf}")
            out += _leaf_paths(v, leaf, f"{prefix}{k}.")
    return out


def where_instead(schema: DictConfig, name: str, key: str, *, recipe: bool = True) -> list[str]:
    """Where a top-level option ``key`` unknown to method ``name`` may be
    meant: the local-training recipe (``method_train.<name>.<key>``; FAFI's
    ``lr`` and FedAvg's ``local_epochs`` were once method options) where the
    method trains with it (``recipe``), the
    method's nested groups that hold ``key`` (``method.fafi.loss.tau``), and
    a group ``<a>`` holding ``<b>`` for a key ``<a>_<b>`` (``noise_std`` ->
    ``method.fafi.noise.std``)."""
    keys = {f.name for f in dataclasses.fields(TrainConfig)}
    out = []
    if recipe and (key in _RECIPE_RENAMES or key in keys):
        out.append(f"method_train.{name}.{_RECIPE_RENAMES.get(key, key)}")
    tree = OmegaConf.to_container(schema)
    assert isinstance(tree, dict)
    group, _, leaf = key.partition("_")
    renamed = isinstance(tree.get(group), Mapping) and leaf in tree[group]
    nested = [f"{group}.{leaf}"] if renamed else []
    nested += _leaf_paths(tree, key)
    return out + [f"method.{name}.{p}" for p in nested]


#: Keys renamed in a config group, and what the new key takes. FitConfig's
#: ``autocast: bfloat16|none`` became ``amp: true|false``, the name local
#: training (``train.amp``) uses for the same concept.
KEY_RENAMES = {"autocast": ("amp", "true (was bfloat16) or false (was none)")}


def renamed_key(prefix: str, key: str) -> str | None:
    """The one-line migration hint for a renamed ``key`` under ``prefix``, or None."""
    if key not in KEY_RENAMES:
        return None
    new, how = KEY_RENAMES[key]
    where = f"{prefix}." if prefix else ""
    return f"{where}{key} was renamed {where}{new}: write {where}{new}={how}"


def own_training_keys(config_cls: type, prefix: str = "") -> list[str]:
    """The dotted keys of ``config_cls``'s optimizer groups (fields whose
    default is an :class:`~osfl.fl.optim.OptimConfig`, e.g. FALCON's
    ``generator_fit``), nested groups searched too: a method's own training
    knobs, named where the shared recipe does not apply to it."""
    out = []
    for f in dataclasses.fields(config_cls):
        default = default_of(f)
        if isinstance(default, OptimConfig):
            out.append(f"{prefix}{f.name}")
        elif dataclasses.is_dataclass(default) and not isinstance(default, type):
            out += own_training_keys(type(default), f"{prefix}{f.name}.")
    return out


def not_recipe_hint(name: str, config_cls: type) -> str:
    """Why ``method_train.<name>`` is refused for a method that does not train
    with the shared recipe, and where its own training knobs are."""
    own = [f"method.{name}.{k}.*" for k in own_training_keys(config_cls)]
    where = (
        f"its own training is set by {' / '.join(own)}"
        if own
        else (f"it has no training recipe (its options: method.{name}.*)")
    )
    return (
        f"method_train.{name} does not apply: {name} does not train with the shared recipe; {where}"
    )
