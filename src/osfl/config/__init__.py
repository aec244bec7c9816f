"""Experiment configuration: OmegaConf structured configs built from frozen dataclasses.

One module per job, re-exported here so that ``from osfl.config import X``
serves every caller: :mod:`~osfl.config.schema` (the dataclasses of a run),
:mod:`~osfl.config.loading` (defaults <- YAML <- overrides, docs/design.md §5),
:mod:`~osfl.config.method_options` (a method's ``Config`` and recipe overrides),
:mod:`~osfl.config.hints` (what to write instead of a moved or renamed key),
:mod:`~osfl.config.options` (option docs for ``osfl list``) and
:mod:`~osfl.config.sweeps` (``--sweep`` grids).
Reference: OmegaConf structured configs,
https://omegaconf.readthedocs.io/en/2.3_branch/structured_config.html
"""

from __future__ import annotations

from osfl.config.loading import (
    config_layers_of,
    default_config_text,
    load_config,
    load_config_text,
    to_dict,
    to_yaml,
    yaml_error_where,
)
from osfl.config.method_options import method_config, method_train_config, options_config
from osfl.config.options import OptionDoc, config_options, option_docs
from osfl.config.schema import (
    DataConfig,
    ExperimentConfig,
    ModelConfig,
    PartitionConfig,
    TransformConfig,
)
from osfl.config.sweeps import LIST_KEYS, expand_sweeps, merge_sweeps, sweep_label

__all__ = [
    "LIST_KEYS",
    "DataConfig",
    "ExperimentConfig",
    "ModelConfig",
    "OptionDoc",
    "PartitionConfig",
    "TransformConfig",
    "config_layers_of",
    "config_options",
    "default_config_text",
    "expand_sweeps",
    "load_config",
    "load_config_text",
    "merge_sweeps",
    "method_config",
    "method_train_config",
    "option_docs",
    "options_config",
    "sweep_label",
    "to_dict",
    "to_yaml",
    "yaml_error_where",
]
