"""Model cards of locally pretrained encoders, and the checks a run makes with them.

An encoder made by ``osfl pretrain`` is a safetensors file in this project's
(timm-style) key names plus a JSON card next to it (``enc.safetensors`` ->
``enc.card.json``) that says what it is and what it has seen: model and
kwargs, the upstream source, classes, image count and content fingerprint
(:meth:`osfl.data.imageset.ImageSet.fingerprint`), the objective and its
options, the optimiser, the final loss and held-out result, the sha256 of the
weights file, the command line and the library versions. The card follows the
spirit of Mitchell et al., "Model Cards for Model Reporting" (FAT* 2019):
enough to judge whether a downstream number can be trusted.

Two functions are for runs that use an encoder:

- :func:`pretrained_info` — the sha256 of the weights and the card (if any),
  for the run record; a card whose sha256 is not the file's is refused;
- :func:`check_disjoint` — refuses (:class:`~osfl.errors.ConfigError`) a
  federated task whose data overlaps the encoder's upstream data, where that
  can be told: the same source and a shared class, or the same content.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from osfl import jsonio
from osfl.errors import ConfigError

#: Version tag of the card layout below; bumped when a field changes meaning.
CARD_SCHEMA = "osfl.pretrain.card/1"
_CHUNK = 1 << 20


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def card_path(weights: str | os.PathLike[str]) -> Path:
    """Where the card of ``weights`` lives: ``enc.safetensors`` -> ``enc.card.json``."""
    p = Path(weights)
    return p.with_name(p.stem + ".card.json")


def write_card(weights: str | os.PathLike[str], card: Mapping[str, Any]) -> Path:
    """Write ``card`` next to ``weights`` (pretty JSON, keys in the given order)."""
    out = card_path(weights)
    out.write_text(json.dumps(card, indent=2) + "\n")
    return out


def read_card(weights: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The card of ``weights`` (None when there is none); a malformed one is refused."""
    p = card_path(weights)
    if not p.is_file():
        return None
    try:
        card = jsonio.loads(p.read_text())
    except ValueError as e:  # bad JSON, too deep, not UTF-8
        raise ConfigError(f"model card {str(p)!r} is not valid JSON: {e}") from e
    if not isinstance(card, dict) or card.get("schema") != CARD_SCHEMA:
        raise ConfigError(
            f"model card {str(p)!r} is not an osfl pretrain card (schema {CARD_SCHEMA!r})"
        )
    return card


def pretrained_info(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What a run records about the encoder it starts from.

    ``{"path", "sha256", "bytes", "card"}``: ``card`` is the JSON card next to
    the file, or None for a checkpoint from elsewhere (a DINOv2 download, say).
    A card whose ``weights.sha256`` is not the file's describes another file
    and is refused rather than recorded.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"pretrained weights {str(p)!r} not found")
    digest = sha256_file(p)
    card = read_card(p)
    if card is not None:
        recorded = card.get("weights", {}).get("sha256")
        if recorded != digest:
            raise ConfigError(
                f"model card {str(card_path(p))!r} describes weights with sha256 {recorded}, "
                f"but {str(p)!r} has sha256 {digest}: the file was changed or replaced after "
                "pretraining; re-run osfl pretrain or remove the stale card"
            )
    return {"path": str(p.resolve()), "sha256": digest, "bytes": p.stat().st_size, "card": card}


# --------------------------------------------------------------------------- disjointness
def canonical_source(spec: str) -> str:
    """A data spec in a comparable form: prefix lower-cased, an existing path
    made absolute (trailing slashes, ``..`` and symlinks resolved), ``domains:``
    unwrapped (restyled images are still the inner source's images)."""
    prefix, sep, rest = spec.strip().partition(":")
    prefix = prefix.strip().lower()
    if prefix == "domains" and sep:
        return canonical_source(rest)
    rest = rest.strip()
    if rest and Path(rest).expanduser().exists():
        rest = str(Path(rest).expanduser().resolve())
    elif len(rest) > 1:
        rest = rest.rstrip("/")
    return f"{prefix}:{rest}" if rest else prefix


def check_disjoint(
    card: Mapping[str, Any],
    data_source: str,
    classes: Sequence[str],
    train_fingerprint: str | None = None,
) -> None:
    """Refuse a federated task whose train data the encoder may have seen.

    ``card`` is a model card (only its ``upstream`` block is read),
    ``data_source`` the task's data spec, ``classes`` the names of the classes
    its clients hold, ``train_fingerprint`` its train set's
    :meth:`~osfl.data.imageset.ImageSet.fingerprint`. Refused, with a
    :class:`~osfl.errors.ConfigError` naming the overlap:

    - the same source (after :func:`canonical_source`) and a shared class name;
    - the same content fingerprint as the upstream train set.

    What cannot be told passes: the same images reached through two different
    specs (``cifar10:<dir>`` vs ``imagefolder:<dir>`` of a JPEG dump), or a
    task holding a different subset of the same classes' images.
    """
    up = card.get("upstream")
    if not isinstance(up, Mapping) or "source" not in up or "classes" not in up:
        raise ConfigError("the model card has no upstream block (source, classes); cannot check")
    up_source = canonical_source(str(up["source"]))
    task_source = canonical_source(data_source)
    if up_source == task_source:
        shared = [c for c in classes if c in set(up["classes"])]
        if shared:
            raise ConfigError(
                f"the encoder's upstream data overlaps the task: both use {task_source!r} and "
                f"share classes {shared}; pretrain on other classes (e.g. --classes with the "
                "complement) or use another task"
            )
    fp = up.get("fingerprint")
    if train_fingerprint is not None and fp is not None and train_fingerprint == fp:
        raise ConfigError(
            f"the encoder's upstream data overlaps the task: the task's train set "
            f"({data_source!r}) has the upstream train set's content fingerprint {fp}"
        )
