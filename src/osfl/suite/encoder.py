"""The suite's encoder, trained once and kept (issue #50).

The FedMITR, FALCON / closed-form and EFTViT rows read an encoder no lease
can download: the suite pretrains one (``pretrain_vitti16``: a ViT-Ti/16,
supervised, on CIFAR-10 classes 0-4). It is small on purpose:
:func:`encoder_to_bf16` (the step's ``post``) stores its weights in bf16
(about 11 MiB, beside its card, whose ``weights`` block is rewritten to
match), so the step ``returns`` both files in the bundle;
``osfl suite import`` checks them (:func:`import_encoder`: the expected
name, at most 16 MiB, a safetensors file of bf16 tensors only, the card's
sha256) and puts them under :data:`COMMITTED` in the repository, which
travels with every later lease. There :func:`committed_encoder` finds them
and the suite reads that copy: the steps that need the encoder no longer
need its step.

A row on this encoder is a row on a **self-pretrained backbone**: the
catalogue labels it so (``Step.backbone``), beside the paper's number.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from osfl.errors import DataError
from osfl.jsonio import loads
from osfl.suite.bundle import FILE_LIMIT
from osfl.suite.steps import ENCODER

#: Where an imported encoder lives in the repository (committed, travels).
COMMITTED = "reproduction/gpu_suite"
CARD_SCHEMA = "osfl.pretrain.card/1"


def card_name(weights: str) -> str:
    """``enc.safetensors`` -> ``enc.card.json`` (:func:`osfl.pretrain.card_path`)."""
    return weights.removesuffix(".safetensors") + ".card.json"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_encoder_card(card: Path, weights: Path) -> dict[str, Any]:
    """``card`` if it is an osfl pretrain card whose sha256 is ``weights``'s
    and ``weights`` holds only bf16 tensors within :data:`FILE_LIMIT`; else
    one :class:`DataError` line."""
    for f in (card, weights):
        if not f.is_file():
            raise DataError(f"{f} is missing or not a regular file")
    if weights.stat().st_size > FILE_LIMIT or card.stat().st_size > 2**20:
        raise DataError(f"{weights} or its card is larger than a bundle returns")
    try:
        doc = loads(card.read_bytes(), max_chars=2**20)
    except ValueError as e:
        raise DataError(f"{card} is damaged ({e})") from None
    if not isinstance(doc, dict) or doc.get("schema") != CARD_SCHEMA:
        raise DataError(f"{card} is not an osfl pretrain card ({CARD_SCHEMA})")
    block = doc.get("weights")
    if not isinstance(block, dict) or block.get("sha256") != _sha256(weights):
        raise DataError(f"{card} does not describe {weights.name} (its sha256 differs)")
    dtypes = _tensor_dtypes(weights)
    other = sorted(d for d in dtypes if d.startswith("F"))  # F16, F32, F64: not stored as bf16
    if other or "BF16" not in dtypes:
        raise DataError(f"{weights} holds {sorted(dtypes)} tensors, not bf16 weights")
    return doc


def _tensor_dtypes(weights: Path) -> set[str]:
    """The dtypes of a safetensors file's tensors, from its JSON header alone
    (no tensor is loaded, nothing unpickled)."""
    with weights.open("rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < n <= 2**20:
            raise DataError(f"{weights} is not a safetensors file")
        try:
            header = loads(f.read(n))
        except ValueError as e:
            raise DataError(f"{weights} has a damaged header ({e})") from None
    if not isinstance(header, dict):
        raise DataError(f"{weights} has a damaged header")
    return {
        str(v.get("dtype"))
        for k, v in header.items()
        if k != "__metadata__" and isinstance(v, dict)
    }


def committed_encoder(repo: Path | None) -> Path | None:
    """The repository's imported encoder, if there is one and its card
    vouches for it (a damaged one is a :class:`DataError`)."""
    if repo is None:
        return None
    weights = repo / COMMITTED / Path(ENCODER).name
    if not weights.exists():
        return None
    read_encoder_card(weights.with_name(card_name(weights.name)), weights)
    return weights


def encoder_to_bf16(step_dir: Path) -> None:
    """Store the encoder step's weights in bf16 and rewrite its card's
    ``weights`` block to match (the float32 file's sha256 kept as
    ``converted_from``): 11 MiB instead of 22 for a ViT-Ti/16."""
    # heavy: torch and safetensors, once the encoder step has finished
    import torch
    from safetensors.torch import load_file, save_file  # heavy: torch

    weights = step_dir / ENCODER
    card = weights.with_name(card_name(weights.name))
    doc = json.loads(card.read_text())
    before = _sha256(weights)
    tensors = load_file(str(weights))
    bf16 = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in tensors.items()}
    tmp = weights.with_name(weights.name + ".tmp")
    save_file(bf16, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, weights)
    doc["weights"] = {
        **doc.get("weights", {}),
        "sha256": _sha256(weights),
        "bytes": weights.stat().st_size,
        "dtype": "bfloat16",
        "converted_from": {"dtype": "float32", "sha256": before},
    }
    card.write_text(json.dumps(doc, indent=2) + "\n")


#: A step's ``post``: what runs on its finished directory.
POSTPROCESS: dict[str, Callable[[Path], None]] = {"encoder_bf16": encoder_to_bf16}


def import_encoder(bundle: Path, repo: Path) -> Path | None:
    """The bundle's encoder (weights and card, checked) copied under
    :data:`COMMITTED`; ``None`` when the bundle holds none."""
    name = Path(ENCODER).name
    weights = bundle / name
    if not weights.exists():
        return None
    card = bundle / card_name(name)
    read_encoder_card(card, weights)
    dest = repo / COMMITTED
    dest.mkdir(parents=True, exist_ok=True)
    for src in (weights, card):
        tmp = dest / (src.name + ".tmp")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest / src.name)
    return dest / name
