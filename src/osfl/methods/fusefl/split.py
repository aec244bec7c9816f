"""Where FuseFL cuts a registered model into K blocks + its classifier.

A block is a run of the model's trunk modules (named by their dotted path in
the model, e.g. ``features.conv1`` or ``layer3``) applied in order; the last
block ends with the global pool and flatten, so its output is the feature the
classifier (``fc``) reads. Cutting only between such modules keeps every
block an exact slice of the registered model: the K blocks applied in turn,
then the classifier, are the model itself (tests check it).

Per model family, a *splitter* maps (model, K) to the blocks' module paths;
:data:`SPLITTERS` holds one per supported model name, so a new family adds
an entry here, not an ``if`` in the method.

- ``cnn_small``: three units, one per conv stage (conv, BN, act, pool; the
  third carries the global pool), grouped evenly into K <= 3 blocks.
- ``resnet18`` / ``resnet50``: five units (stem, layer1..layer4 + pool). K = 2,
  3, 4 follow the public code's ``EXNN_Split_Configs['resnet18']``
  (``models/configs.py``: stem+layer1+layer2 | layer3+layer4; stem |
  layer1+layer2 | layer3+layer4; stem | layer1+layer2 | layer3 | layer4),
  K = 5 is one unit per block. The code's K = 8 cuts inside the stages
  (single residual blocks); not offered here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import nn

from osfl.errors import ConfigError
from osfl.registry import Registry

__all__ = ["SPLITTERS", "ModelSplit", "block_module", "max_blocks", "split_model"]

Blocks = tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Splitter:
    """``units(model)``: the model's indivisible runs of trunk modules, in order;
    ``groups(K)``: which units form each of the K blocks (``None``: even groups)."""

    units: Callable[[nn.Module], list[tuple[str, ...]]]
    max_blocks: int
    groups: Callable[[int], Sequence[Sequence[int]]] | None = None


@dataclass(frozen=True)
class ModelSplit:
    """The K blocks' module paths (in order) and the classifier's name."""

    blocks: Blocks
    head: str

    @property
    def k(self) -> int:
        return len(self.blocks)


def _even_groups(units: int, k: int) -> list[list[int]]:
    """K contiguous groups of ``units`` items, as even as they come (later
    groups take the extra unit: the deep end of a model holds most weights)."""
    edges = [int(i * units / k) for i in range(k + 1)]
    return [list(range(edges[i], edges[i + 1])) for i in range(k)]


def _cnn_units(model: nn.Module) -> list[tuple[str, ...]]:
    """One unit per conv stage of ``SmallCNN.features`` (a stage starts at ``conv*``)."""
    units: list[list[str]] = []
    for name, _ in model.get_submodule("features").named_children():
        if name.startswith("conv") or not units:
            units.append([])
        units[-1].append(f"features.{name}")
    return [tuple(u) for u in units]


def _resnet_units(model: nn.Module) -> list[tuple[str, ...]]:
    """Stem (conv1, bn1, act[, maxpool]), layer1, layer2, layer3, layer4 + pool + flatten."""
    names = list(model.trunk_names)  # type: ignore[attr-defined]
    first = names.index("layer1")
    return [
        tuple(names[:first]),
        ("layer1",),
        ("layer2",),
        ("layer3",),
        tuple(names[names.index("layer4") :]),
    ]


#: The public code's resnet18 cuts (models/configs.py), in units of
#: :func:`_resnet_units`; K = 5 is one unit per block.
_RESNET_GROUPS: dict[int, list[list[int]]] = {
    2: [[0, 1, 2], [3, 4]],
    3: [[0], [1, 2], [3, 4]],
    4: [[0], [1, 2], [3], [4]],
    5: [[0], [1], [2], [3], [4]],
}

#: Model name -> how FuseFL cuts it.
SPLITTERS: Registry[Splitter] = Registry("FuseFL model split")
SPLITTERS.add("cnn_small", Splitter(_cnn_units, max_blocks=3))
for _name in ("resnet18", "resnet50"):
    SPLITTERS.add(_name, Splitter(_resnet_units, max_blocks=5, groups=_RESNET_GROUPS.__getitem__))


def _splitter(model_name: str) -> Splitter:
    if model_name not in SPLITTERS:
        raise ConfigError(
            f"method.fusefl cannot split model {model_name!r} into blocks; "
            f"supported models: {', '.join(SPLITTERS.names())}"
        )
    return SPLITTERS.get(model_name)


def max_blocks(model_name: str) -> int:
    """The largest K FuseFL offers for ``model_name`` (refuses unsupported models)."""
    return _splitter(model_name).max_blocks


def split_model(model_name: str, model: nn.Module, k: int) -> ModelSplit:
    """The K blocks of ``model`` (registered as ``model_name``) and its classifier's name."""
    sp = _splitter(model_name)
    if not 2 <= k <= sp.max_blocks:
        raise ConfigError(
            f"method.fusefl: blocks must be between 2 and {sp.max_blocks} for model "
            f"{model_name!r}, got {k}"
        )
    units = sp.units(model)
    groups = sp.groups(k) if sp.groups is not None else _even_groups(len(units), k)
    blocks = tuple(tuple(p for i in g for p in units[i]) for g in groups)
    return ModelSplit(blocks=blocks, head=model.classifier_name)  # type: ignore[attr-defined]


def block_module(model: nn.Module, paths: Sequence[str]) -> nn.Sequential:
    """Block ``paths`` of ``model`` as an ``nn.Sequential`` that *shares* the
    model's modules (training it trains the model). Child names are the paths
    with ``.`` -> ``_`` (``features_conv1``), so its state-dict keys name the
    model's modules unambiguously."""
    return nn.Sequential(OrderedDict((p.replace(".", "_"), model.get_submodule(p)) for p in paths))
