"""What ``osfl pretrain`` trains: one frozen-dataclass tree, loaded like a run config.

Layers, each overriding the previous one (as ``osfl run`` does, docs/design.md §5)::

    dataclass defaults  <-  YAML file (configs/pretrain_*.yaml)  <-  dotted overrides

The upstream block is a run's :class:`~osfl.config.DataConfig` plus the classes
to use, the model block is a run's :class:`~osfl.config.ModelConfig` and the
optimisation is a run's :class:`~osfl.fl.train_config.TrainConfig`, so a
pretraining recipe reads like the runs that will use its encoder. Each
objective's own knobs live in a nested dataclass of its own
(:class:`SupervisedConfig`, :class:`DinoConfig`, :class:`MaeConfig`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from osfl.config import DataConfig, ModelConfig
from osfl.errors import ConfigError
from osfl.fl.train_config import TrainConfig


@dataclass(frozen=True)
class UpstreamConfig(DataConfig):
    """The declared upstream data: a data spec with its load options, and the
    classes to pretrain on (names or indices of the source's classes; empty =
    all). The source's own test split, restricted to the same classes, is the
    held-out set. ``cache_dir`` defaults to the run default, so CIFAR-10 is
    decoded once."""

    image_size: int | None = None
    cache_dir: str | None = ".osfl_cache"
    classes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SupervisedConfig:
    """Cross-entropy on the upstream labels with the ``augment`` pipeline
    (``osfl.data.transforms.PIPELINES``)."""

    augment: str = "crop_flip"
    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(
                f"supervised.label_smoothing must lie in [0, 1), got {self.label_smoothing}"
            )


@dataclass(frozen=True)
class DinoConfig:
    """DINO self-distillation (Caron et al., ICCV 2021), scaled down for small images.

    Defaults are the paper's (``main_dino.py``) except the projection head
    (``out_dim`` 65,536 -> 1,024, ``hidden_dim`` 2,048 -> 512, ``bottleneck_dim``
    256 -> 128: a 5-class upstream set does not need 65k prototypes) and the
    local crops, which are fed at the global resolution because this ViT has a
    fixed input size (see docs/pretrain.md). ``teacher_temp_warmup`` is the
    fraction of training over which the teacher temperature rises linearly from
    ``warmup_teacher_temp`` to ``teacher_temp`` (the paper: 30 of 100–800 epochs).
    """

    out_dim: int = 1024
    hidden_dim: int = 512
    bottleneck_dim: int = 128
    student_temp: float = 0.1
    teacher_temp: float = 0.04
    warmup_teacher_temp: float = 0.04
    teacher_temp_warmup: float = 0.3
    center_momentum: float = 0.9
    momentum_teacher: float = 0.996
    freeze_last_layer_epochs: float = 1.0
    global_crop_min_scale: float = 0.4
    local_crops: int = 2
    local_crop_max_scale: float = 0.4
    local_crop_min_scale: float = 0.05
    solarize_p: float = 0.2

    def __post_init__(self) -> None:
        for name in ("out_dim", "hidden_dim", "bottleneck_dim"):
            if getattr(self, name) < 1:
                raise ConfigError(f"dino.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("student_temp", "teacher_temp", "warmup_teacher_temp"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"dino.{name} must be > 0, got {getattr(self, name)}")
        for name in ("teacher_temp_warmup", "center_momentum", "solarize_p"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"dino.{name} must lie in [0, 1], got {getattr(self, name)}")
        if not 0.0 <= self.momentum_teacher < 1.0:
            raise ConfigError(
                f"dino.momentum_teacher must lie in [0, 1), got {self.momentum_teacher}"
            )
        if self.local_crops < 0 or self.freeze_last_layer_epochs < 0:
            raise ConfigError("dino.local_crops and dino.freeze_last_layer_epochs must be >= 0")
        lo, mid = self.local_crop_min_scale, self.local_crop_max_scale
        if not 0.0 < lo <= mid <= 1.0 or not 0.0 < self.global_crop_min_scale <= 1.0:
            raise ConfigError(
                "dino crop scales must satisfy 0 < local_crop_min_scale <= local_crop_max_scale "
                f"<= 1 and 0 < global_crop_min_scale <= 1, got {lo}, {mid}, "
                f"{self.global_crop_min_scale}"
            )


@dataclass(frozen=True)
class MaeConfig:
    """MAE masked reconstruction (He et al., CVPR 2022), scaled down.

    The paper's mask ratio (75 %), normalised-pixel targets and a light
    decoder (8 blocks of width 512 for ViT-L; here ``decoder_depth`` blocks of
    ``decoder_dim``, the same narrow-and-shallow-relative-to-the-encoder idea).
    Augmentation is the paper's: random resized crop (scale 0.2–1) and flip.
    """

    mask_ratio: float = 0.75
    decoder_dim: int = 128
    decoder_depth: int = 2
    decoder_heads: int = 4
    norm_pix_loss: bool = True
    crop_min_scale: float = 0.2

    def __post_init__(self) -> None:
        if not 0.0 < self.mask_ratio < 1.0:
            raise ConfigError(f"mae.mask_ratio must lie in (0, 1), got {self.mask_ratio}")
        if min(self.decoder_dim, self.decoder_depth, self.decoder_heads) < 1:
            raise ConfigError("mae.decoder_dim, decoder_depth and decoder_heads must be >= 1")
        if self.decoder_dim % self.decoder_heads:
            raise ConfigError(
                f"mae.decoder_dim ({self.decoder_dim}) must be divisible by decoder_heads "
                f"({self.decoder_heads})"
            )
        if not 0.0 < self.crop_min_scale <= 1.0:
            raise ConfigError(f"mae.crop_min_scale must lie in (0, 1], got {self.crop_min_scale}")


def _default_train() -> TrainConfig:
    # AdamW + cosine, as DeiT / DINO / MAE pretrain ViTs; batch 128 fits a CPU.
    return TrainConfig(
        optimizer="adamw",
        lr=5e-4,
        weight_decay=0.05,
        schedule="cosine",
        grad_clip=3.0,
        epochs=10,
        batch_size=128,
        drop_last=True,
    )


@dataclass(frozen=True)
class PretrainConfig:
    """One ``osfl pretrain`` recipe (see ``configs/pretrain_*.yaml``).

    ``warmup_epochs`` is the linear learning-rate warm-up in epochs (turned
    into ``train.warmup_steps`` once the upstream size is known; leave
    ``train.warmup_steps`` at 0). ``probe_max_per_class`` caps the upstream
    images a self-supervised encoder's linear head is fitted on.
    """

    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    model: ModelConfig = field(default_factory=lambda: ModelConfig(name="vit_tiny_patch4_32"))
    objective: str = "supervised"
    train: TrainConfig = field(default_factory=_default_train)
    warmup_epochs: float = 1.0
    seed: int = 0
    device: str = "auto"
    probe_max_per_class: int | None = 1000
    supervised: SupervisedConfig = field(default_factory=SupervisedConfig)
    dino: DinoConfig = field(default_factory=DinoConfig)
    mae: MaeConfig = field(default_factory=MaeConfig)

    def __post_init__(self) -> None:
        if self.warmup_epochs < 0:
            raise ConfigError(f"warmup_epochs must be >= 0, got {self.warmup_epochs}")
        if self.train.warmup_steps:
            raise ConfigError(
                "set the warm-up with warmup_epochs, not train.warmup_steps (it is derived "
                "from warmup_epochs and the upstream size)"
            )
        if self.train.steps is not None:
            raise ConfigError("train.steps is not used by osfl pretrain; set train.epochs")
        if self.device.split(":")[0] not in ("auto", "cpu", "cuda", "mps"):
            raise ConfigError(f"device={self.device!r} is not valid; choose auto, cpu or cuda")
        if self.probe_max_per_class is not None and self.probe_max_per_class < 1:
            raise ConfigError(
                f"probe_max_per_class must be >= 1 or null, got {self.probe_max_per_class}"
            )


# --------------------------------------------------------------------------- loading
def _translate(e: OmegaConfBaseException, schema: DictConfig, source: str) -> ConfigError:
    key = getattr(e, "full_key", "") or ""
    if isinstance(e, ConfigKeyError | AttributeError) or "not in" in str(e):
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        node = OmegaConf.select(schema, parent) if parent else schema
        valid = ", ".join(sorted(node.keys())) if isinstance(node, DictConfig) else "(none)"
        return ConfigError(
            f"unknown pretrain key {key!r} ({source}); valid keys at {parent or 'top level'}: "
            f"{valid}"
        )
    return ConfigError(f"bad value for {key!r} ({source}): {str(e).splitlines()[0]}")


def _file_layer(path: str | Path | None) -> list[tuple[Any, str]]:
    """The YAML file's layer with its name for messages (none without a
    file); a missing or unparsable file is one clear line."""
    if path is None:
        return []
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"pretrain config file not found: {p}")
    try:
        return [(OmegaConf.load(p), str(p))]
    except Exception as e:  # yaml errors
        raise ConfigError(f"cannot parse {p}: {str(e).splitlines()[0]}") from e


def _override_layer(overrides: Sequence[str]) -> list[tuple[Any, str]]:
    """The ``key=value`` overrides' layer (none without overrides)."""
    bad = [o for o in overrides if "=" not in o or o.startswith("=")]
    if bad:
        raise ConfigError(f"override {bad[0]!r} must look like key=value (e.g. train.epochs=5)")
    if not overrides:
        return []
    try:
        return [(OmegaConf.from_dotlist(list(overrides)), "command-line overrides")]
    except OmegaConfBaseException as e:
        raise ConfigError(f"cannot parse overrides {list(overrides)}: {e}") from e


def load_pretrain_config(
    path: str | Path | None = None, overrides: Sequence[str] = ()
) -> PretrainConfig:
    """Defaults <- YAML ``path`` <- ``key=value`` overrides, validated."""
    schema = OmegaConf.structured(PretrainConfig)
    layers = _file_layer(path) + _override_layer(overrides)
    merged: Any = schema
    for layer, source in layers:
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as e:
            raise _translate(e, schema, source) from e
    try:
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise _translate(e, schema, "merged config") from e
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:  # a __post_init__ refusing a value
        raise ConfigError(f"invalid pretrain config: {e}") from e
    assert isinstance(cfg, PretrainConfig)
    return cfg


def to_dict(cfg: Any) -> dict[str, Any]:
    """A plain JSON-able dict of a (nested) config dataclass."""
    return dataclasses.asdict(cfg)
