"""Honest local pretrained encoders (``osfl pretrain``; docs/pretrain.md).

FedMITR, FALCON and EFTViT start from pretrained ViTs, FedPFT/FedCGS need a
frozen pretrained encoder, and PEFT baselines mean nothing on a random ViT.
Where no published checkpoint can be had (:mod:`osfl.models.weights` loads
those), this package makes one on a *declared* upstream data set and says
exactly what it has seen:

- :mod:`~osfl.pretrain.config` — the recipe (:class:`PretrainConfig`);
- :mod:`~osfl.pretrain.upstream` — the upstream source and the classes kept;
- :mod:`~osfl.pretrain.objectives` — the objective registry and ``supervised``;
  :mod:`~osfl.pretrain.dino` (DINO, Caron et al., ICCV 2021) and
  :mod:`~osfl.pretrain.mae` (MAE, He et al., CVPR 2022);
- :mod:`~osfl.pretrain.train` — the training run (the project's local-training loop);
- :mod:`~osfl.pretrain.probe` — linear probing of frozen features;
- :mod:`~osfl.pretrain.export` / :mod:`~osfl.pretrain.card` — the weights file,
  its model card, :func:`pretrained_info` and :func:`check_disjoint`.

``card`` imports nothing heavy, so a run can check an encoder cheaply.
"""

from osfl.pretrain.card import (
    CARD_SCHEMA,
    card_path,
    check_disjoint,
    pretrained_info,
    read_card,
    sha256_file,
)

__all__ = [
    "CARD_SCHEMA",
    "card_path",
    "check_disjoint",
    "pretrained_info",
    "read_card",
    "sha256_file",
]
