"""What ``osfl eval`` checks before it says a kept model is "equal": every
file of the model, the run's own record, and the grid point, each read from
inside the run directory and nowhere else (issue 51, "Hostile peers and
damaged files, round four").

A kept model (:mod:`osfl.kept_model`) is three files under
``RUN_DIR/models/<slug>/``. Scoring it says something only if what is scored
is what the run made, so before a number is printed:

- **the files are the run's**: ``models/``, each model folder and each file
  are real (no symbolic link, nothing resolving outside the run directory)
  and regular (a FIFO would hang the reader, ``/dev/zero`` never ends), of a
  bounded size (the card's recorded size where it has one), and every file
  the card lists matches its sha256 — the weights file (``model.safetensors``)
  as well as the state, and the weights must then be the very tensors the
  method's predictor rebuilds from the state (:meth:`KeptModel.check_weights`);
- **the record is the run's**: the card's accuracy is compared with the
  record in ``metrics.json`` for the same grid point, method and seed, not
  only with itself, so a state and card resealed together still disagree
  with the record (:func:`record_of`);
- **the task is the run's**: the card's grid point must be one of the points
  the run's ``config.yaml`` expands to, and that point's own overrides are
  what the task is rebuilt with (:func:`grid_point`): a card cannot set any
  config key, so it cannot point the data loading anywhere.
"""

from __future__ import annotations

import hashlib
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors

from osfl.config import ExperimentConfig, expand_sweeps, sweep_label
from osfl.errors import DataError
from osfl.fl.state_codec import state_from_bytes
from osfl.record import RecordError, RunRecord, file_version, read_records
from osfl.safe_read import GIB, MIB, check_inside, read_bytes, read_json, read_text

#: The run directory's folder of kept models, one sub-folder per job.
MODELS_DIR = "models"
STATE_FILE = "state.safetensors"
MODEL_FILE = "model.safetensors"
CARD_FILE = "card.json"
#: What a card says it is, and its layout's version.
CARD_FORMAT = "osfl-kept-model"
CARD_VERSION = 1
#: The most a model file may hold when its card records no size (cards
#: written before ``sizes``): a ViT-L state is about 1.2 GiB.
MAX_MODEL_BYTES = 16 * GIB
MAX_CARD_BYTES = 1 * MIB
#: ``metrics.json`` and ``config.yaml`` of a run directory, read to check a model.
MAX_METRICS_BYTES = 256 * MIB
MAX_CONFIG_BYTES = 1 * MIB
_SHA256 = re.compile(r"[0-9a-f]{64}")

#: A card's fields and the types they must have (a damaged card is refused).
_CARD_FIELDS: dict[str, type | tuple[type, ...]] = {
    "method": str,
    "seed": int,
    "point": str,
    "sweep": dict,
    "config_sha256": str,
    "accuracy": (float, int, type(None)),
    "scored_at": str,
    "files": dict,
}


@dataclass(frozen=True)
class KeptModel:
    """One kept model: its folder, its card and the run directory it is in."""

    path: Path
    card: dict[str, Any]
    root: Path

    @property
    def method(self) -> str:
        return str(self.card["method"])

    @property
    def seed(self) -> int:
        return int(self.card["seed"])

    def state(self) -> Any:
        """The final server state, checked against the card's sha256 first."""
        blob = self._checked(STATE_FILE)
        try:
            return state_from_bytes(blob)
        except (DataError, ValueError, KeyError, TypeError, SafetensorError) as e:
            raise DataError(f"{self.path / STATE_FILE} is not a server state ({e})") from None

    def check_weights(self, predictor: Any) -> None:
        """``model.safetensors`` is the very ``state_dict`` of ``predictor``
        (the method's predictor rebuilt from the verified state): the file the
        docs offer for the weights alone must be the model that was scored."""
        listed = MODEL_FILE in self.card["files"]
        if not isinstance(predictor, torch.nn.Module):
            if listed:
                raise DataError(
                    f"{self.path / MODEL_FILE}: the card lists weights, but {self.method}'s "
                    "predictor has none"
                )
            return
        if not listed:
            raise DataError(f"{self.path / CARD_FILE} is damaged (it lists no {MODEL_FILE})")
        try:
            saved = load_safetensors(self._checked(MODEL_FILE))
        except SafetensorError as e:
            raise DataError(f"{self.path / MODEL_FILE} is not a safetensors file ({e})") from None
        want = {k: v for k, v in predictor.state_dict().items() if isinstance(v, torch.Tensor)}
        same = sorted(saved) == sorted(want) and all(
            saved[k].shape == want[k].shape
            and saved[k].dtype == want[k].dtype
            and torch.equal(saved[k], want[k].detach().to("cpu"))
            for k in want
        )
        if not same:
            raise DataError(
                f"{self.path / MODEL_FILE} holds other weights than the model its "
                f"{STATE_FILE} rebuilds"
            )

    def _checked(self, name: str) -> bytes:
        """The bytes of one of the model's files, read from inside the run
        directory (no link, a regular file of a bounded size) and matched
        against the card's sha256 (and recorded size) before anything reads them."""
        path = self.path / name
        size = (self.card.get("sizes") or {}).get(name)
        bound = size if isinstance(size, int) and not isinstance(size, bool) else MAX_MODEL_BYTES
        what = "kept model file"
        blob = read_bytes(path, max_bytes=bound, what=what, follow_links=False, inside=self.root)
        if isinstance(size, int) and len(blob) != size:
            raise DataError(f"{path} is damaged ({len(blob)} bytes, the card says {size})")
        if hashlib.sha256(blob).hexdigest() != self.card["files"].get(name):
            raise DataError(f"{path} is damaged (its sha256 differs from the card's)")
        return blob


def _card_problem(card: Any) -> str | None:
    """Why ``card`` is not a version-1 model card (``None``: it is one): the
    first problem of its form, its files, or its sizes and sweep, each
    checked only once the one before holds."""
    for check in (_form_problem, _files_problem, _values_problem):
        why = check(card)
        if why is not None:
            return why
    return None


def _form_problem(card: Any) -> str | None:
    """A card of this format and version, every field of its JSON type."""
    if not isinstance(card, dict) or card.get("format") != CARD_FORMAT:
        return "is not an osfl model card"
    if card.get("version") != CARD_VERSION:
        return f"has card version {str(card.get('version'))[:20]!r}; this osfl reads 1"
    for key, kind in _CARD_FIELDS.items():
        if not isinstance(card.get(key), kind) or isinstance(card.get(key), bool):
            return f"is damaged (field {key!r} missing or of the wrong type)"
    return None


def _files_problem(card: dict[str, Any]) -> str | None:
    """The state file (and for a model its weights) and nothing else, each
    with a sha256 the bytes are matched against before anything reads them."""
    files = card["files"]
    if STATE_FILE not in files or set(files) - {STATE_FILE, MODEL_FILE}:
        return f"is damaged (files must be {STATE_FILE} and, for a model, {MODEL_FILE})"
    if not all(isinstance(v, str) and _SHA256.fullmatch(v) for v in files.values()):
        return "is damaged (a file's sha256 is not 64 hex digits)"
    return None


def _values_problem(card: dict[str, Any]) -> str | None:
    """Byte counts within :data:`MAX_MODEL_BYTES` (they bound the reads) and
    a sweep of strings (it is matched against the run's)."""
    sizes = card.get("sizes", {})
    if not isinstance(sizes, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_MODEL_BYTES
        for v in sizes.values()
    ):
        return "is damaged (field 'sizes' is not a byte count per file)"
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in card["sweep"].items()):
        return "is damaged (its sweep is not a mapping of keys to values)"
    return None


def read_card(folder: Path, root: Path) -> KeptModel:
    """The kept model in ``folder`` (a real folder under ``root``'s ``models/``)."""
    path = folder / CARD_FILE
    card = read_json(
        path,
        max_bytes=MAX_CARD_BYTES,
        max_depth=4,
        what="model card",
        follow_links=False,
        inside=root,
    )
    why = _card_problem(card)
    if why is not None:
        raise DataError(f"{path} {why}")
    return KeptModel(folder, card, root)


def run_file(root: Path, name: str, *, max_bytes: int) -> str:
    """The text of ``root/name``, one of the run's own files (a regular file
    in the run directory, not a link), for checking a model against it."""
    return read_text(
        root / name, max_bytes=max_bytes, what="run file", follow_links=False, inside=root
    )


def model_folders(root: Path) -> list[Path]:
    """``root/models``'s model folders, each a real folder (a link to
    another run's models, or a file where a folder should be, is refused)."""
    models = root / MODELS_DIR
    if not models.exists() and not models.is_symlink():
        return []
    check_inside(models, root)
    if not models.is_dir():
        raise DataError(f"{models} is not a folder of kept models")
    folders = []
    for p in sorted(models.iterdir()):
        if p.name.startswith("."):  # an unfinished write
            continue
        mode = p.lstat().st_mode
        if stat.S_ISLNK(mode):
            raise DataError(f"{p} is a symbolic link: a kept model must be the run's own folder")
        if not stat.S_ISDIR(mode):
            raise DataError(f"{p} is not a kept model's folder")
        folders.append(p)
    return folders


def records_of(root: Path) -> dict[tuple[str, str, int], RunRecord]:
    """The finished records of the run's ``metrics.json`` by (grid point,
    method, seed); a kept model without its record is not confirmed."""
    path = root / "metrics.json"
    doc = read_json(
        path, max_bytes=MAX_METRICS_BYTES, what="run file", follow_links=False, inside=root
    )
    if not isinstance(doc, dict) or not isinstance(doc.get("records"), list):
        raise DataError(f"{path}: damaged (no list of records)")
    try:
        records = read_records(doc["records"], file_version(doc))
    except RecordError as e:
        raise DataError(f"{path}: damaged ({e})") from None
    return {(str(r.get("point", "")), r["method"], int(r["seed"])): r for r in records}


def record_of(records: Mapping[tuple[str, str, int], RunRecord], kept: KeptModel) -> RunRecord:
    """The record of ``kept``'s grid point, method and seed."""
    key = (kept.card["point"], kept.method, kept.seed)
    if key not in records:
        at = f" at {key[0]}" if key[0] else ""
        raise DataError(
            f"{kept.path}: metrics.json holds no record of {kept.method} seed {kept.seed}{at}; "
            "a model without its run's record cannot be confirmed"
        )
    return records[key]


def grid_point(stored: ExperimentConfig, kept: KeptModel) -> dict[str, str]:
    """The overrides of the run's own grid point that ``kept``'s card names:
    the card picks one of the points ``config.yaml``'s ``sweep`` expands to
    and sets nothing itself."""
    points = expand_sweeps(list(stored.sweep))
    sweep = kept.card["sweep"]
    for point in points:
        if point == sweep:
            return dict(point)
    labels = ", ".join(sweep_label(p) or "(none)" for p in points[:4])
    raise DataError(
        f"{kept.path / CARD_FILE} names grid point {sweep_label(sweep)[:80]!r}, which the run's "
        f"config.yaml does not hold (its points: {labels})"
    )


def duplicates(found: Sequence[KeptModel]) -> None:
    """Refuse two folders whose cards name one grid point, method and seed."""
    seen: dict[tuple[str, str, int], Path] = {}
    for k in found:
        key = (k.card["point"], k.method, k.seed)
        if key in seen:
            raise DataError(
                f"{k.path} and {seen[key]} both claim {k.method} seed {k.seed}: one is "
                "not this run's"
            )
        seen[key] = k.path
