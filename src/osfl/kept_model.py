"""Each finished method's final server model, kept in the run directory and
scored again later (``osfl eval RUN_DIR``; docs/run-directory.md, "Kept models").

A researcher who reads an accuracy in ``metrics.json`` should be able to hold
the model that made it and check the number, without training again. So
every job whose server has a predictor keeps, in ``models/<slug>/``:

- ``state.safetensors``: the final server state (:mod:`osfl.fl.state_codec`,
  no pickle), what :func:`evaluate_run` rebuilds the predictor from with the
  method's own ``predictor(state)``;
- ``model.safetensors``: the predictor's ``state_dict``, for whoever only
  wants the weights;
- ``card.json``: method, seed, grid point, a hash of the config that made it,
  the accuracy the record holds, the CPU fingerprint and device, osfl's
  version and commit, and the sha256 of both files (a damaged file is named,
  never loaded).

:func:`evaluate_run` rebuilds each kept model's task from the run's
``config.yaml`` through :mod:`osfl.assembly` (the very functions the run used;
nothing trains) and scores it on the run's test split or another data
spec's. On the machine that ran it the accuracy equals the card's exactly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from osfl import __version__, assembly, jsonio
from osfl.code_version import code_version
from osfl.config import ExperimentConfig, load_config, to_dict
from osfl.errors import ConfigError, DataError
from osfl.fl.fingerprint import cpu_fingerprint, fingerprint_id
from osfl.fl.runtime.base import Job, RunResult
from osfl.fl.state_codec import state_from_bytes, state_to_bytes
from osfl.record import RunRecord

#: The run directory's folder of kept models, one sub-folder per job.
MODELS_DIR = "models"
STATE_FILE = "state.safetensors"
MODEL_FILE = "model.safetensors"
CARD_FILE = "card.json"
#: What a card says it is, and its layout's version.
CARD_FORMAT = "osfl-kept-model"
CARD_VERSION = 1
#: Config keys that change where or how fast a run goes, or what else it ran,
#: never the model of one method × seed: left out of ``config_sha256``.
NOT_HASHED = ("name", "methods", "seeds", "sweep", "progress", "out_dir", "cache_dir")
NOT_HASHED += ("parallel_clients", "logger")


def config_sha256(cfg: ExperimentConfig) -> str:
    """A short hash of what a grid point's config makes a model from (16 hex
    digits; :data:`NOT_HASHED` keys left out): two runs of one method and seed
    with equal hashes trained alike."""
    kept = {k: v for k, v in to_dict(cfg).items() if k not in NOT_HASHED}
    text = json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _tensors_of(predictor: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The predictor's weights as safetensors takes them (CPU copies: tied
    weights would share memory, which it refuses)."""
    return {
        k: v.detach().to("cpu").contiguous().clone()
        for k, v in predictor.state_dict().items()
        if isinstance(v, torch.Tensor)
    }


def keep_model(
    where: Path, cfg: ExperimentConfig, job: Job, result: RunResult, record: RunRecord
) -> Path | None:
    """Write ``job``'s final server model to ``where`` (see the module
    docstring); returns it, or ``None`` when the job has no server model to
    keep (``local``: only the clients' own models; ``train_clients``: no
    state). The folder appears whole or not at all; an older one is replaced."""
    if result.state is None or record.get("global_test_accuracy") is None:
        return None
    blobs = {STATE_FILE: state_to_bytes(result.state)}
    if isinstance(result.predictor, torch.nn.Module):
        blobs[MODEL_FILE] = save(_tensors_of(result.predictor))
    provenance = record.get("provenance") or {}
    card = {
        "format": CARD_FORMAT,
        "version": CARD_VERSION,
        "method": job.method.name,
        "seed": job.seed,
        "point": record.get("point", ""),
        "sweep": dict(record.get("sweep") or {}),
        "config_sha256": config_sha256(cfg),
        "accuracy": record["global_test_accuracy"],
        "test_samples": record.get("num_samples"),
        "scored_at": "sites" if job.evaluate_at_clients else "server",
        "cpu_fingerprint": provenance.get("cpu_fingerprint"),
        "device": provenance.get("device"),
        "torch": provenance.get("torch"),
        "osfl_version": __version__,
        "code": code_version(),
        "files": {name: hashlib.sha256(blob).hexdigest() for name, blob in blobs.items()},
    }
    tmp = where.with_name(f".{where.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, blob in blobs.items():
        (tmp / name).write_bytes(blob)
    (tmp / CARD_FILE).write_text(jsonio.dumps(card, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(where, ignore_errors=True)
    os.replace(tmp, where)
    return where


@dataclass(frozen=True)
class KeptModel:
    """One kept model: its folder and its card."""

    path: Path
    card: dict[str, Any]

    @property
    def method(self) -> str:
        return str(self.card["method"])

    @property
    def seed(self) -> int:
        return int(self.card["seed"])

    def state(self) -> Any:
        """The final server state, checked against the card's sha256 first."""
        return state_from_bytes(self._checked(STATE_FILE))

    def _checked(self, name: str) -> bytes:
        path = self.path / name
        try:
            blob = path.read_bytes()
        except OSError as e:
            raise DataError(f"{path} cannot be read ({e.strerror}); re-run the job") from e
        if hashlib.sha256(blob).hexdigest() != self.card["files"].get(name):
            raise DataError(f"{path} is damaged (its sha256 differs from the card's)")
        return blob


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


def _read_card(folder: Path) -> KeptModel:
    path = folder / CARD_FILE
    try:
        card = jsonio.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise DataError(f"{path} cannot be read ({e.strerror}); re-run the job") from e
    except ValueError as e:
        raise DataError(f"{path} is damaged (not JSON: {e})") from e
    if not isinstance(card, dict) or card.get("format") != CARD_FORMAT:
        raise DataError(f"{path} is not an osfl model card")
    if card.get("version") != CARD_VERSION:
        raise DataError(f"{path} has card version {card.get('version')!r}; this osfl reads 1")
    for key, kind in _CARD_FIELDS.items():
        if not isinstance(card.get(key), kind) or isinstance(card.get(key), bool):
            raise DataError(f"{path} is damaged (field {key!r} missing or of the wrong type)")
    return KeptModel(folder, card)


def kept_models(run_dir: str | Path, method: str | None = None) -> list[KeptModel]:
    """The kept models of ``run_dir`` (of ``method`` only, when given), in
    folder order; a clear error when there are none to score."""
    root = Path(run_dir)
    if not (root / "config.yaml").is_file():
        raise DataError(
            f"{root} is not an osfl run directory (no config.yaml); pass the directory "
            "`osfl run` printed"
        )
    folders = sorted(p for p in (root / MODELS_DIR).glob("*") if p.is_dir())
    folders = [p for p in folders if not p.name.startswith(".")]  # an unfinished write
    if not folders:
        raise DataError(
            f"{root} keeps no models ({MODELS_DIR}/ is missing or empty): a run made before "
            "osfl kept models, or whose methods have no server model (local), has none; "
            "re-run it with this osfl"
        )
    found = [_read_card(p) for p in folders]
    if method is None:
        return found
    chosen = [k for k in found if k.method == method]
    if not chosen:
        names = ", ".join(sorted({k.method for k in found}))
        raise ConfigError(
            f"--method {method}: {root} keeps no model of it (kept: {names}; a method "
            "without a server model, e.g. local, keeps none)"
        )
    return chosen


@dataclass(frozen=True)
class Rescored:
    """One kept model scored again: what its card said and what it scores
    now (``accuracy`` ``None``: skipped, ``note`` says why)."""

    method: str
    seed: int
    point: str
    card_accuracy: float | None
    accuracy: float | None
    test_samples: int | None
    same_config: bool
    same_cpu: bool
    note: str = ""

    @property
    def equal(self) -> bool:
        """Whether the accuracy now is exactly the card's."""
        return self.accuracy is not None and self.accuracy == self.card_accuracy


class _Tasks:
    """The run's tasks rebuilt from its ``config.yaml``, each loaded once:
    the config of a grid point, its data, a seed's context."""

    def __init__(self, root: Path, data: str | None, device: str | None):
        self.root, self.data, self.device = root, data, device
        self._splits: dict[str, Any] = {}
        self._ctx: dict[tuple[str, int], assembly.SeedContext] = {}

    def config(self, sweep: Mapping[str, Any]) -> tuple[ExperimentConfig, str]:
        """A grid point's config (on ``device`` when given) and the
        :func:`config_sha256` of the config the run resolved it to."""
        overrides = [f"{k}={v}" for k, v in sweep.items()]
        try:
            cfg = assembly.resolve_parallel(load_config(self.root / "config.yaml", overrides))
        except ConfigError as e:
            raise ConfigError(f"{self.root}/config.yaml does not load ({e})") from e
        sha = config_sha256(cfg)
        if self.device is not None:
            cfg = dataclasses.replace(cfg, device=self.device)
        return cfg, sha

    def splits(self, cfg: ExperimentConfig) -> Any:
        key = repr(cfg.data)
        if key not in self._splits:
            self._splits[key] = assembly.load_splits(cfg)
        return self._splits[key]

    def context(self, cfg: ExperimentConfig, seed: int) -> assembly.SeedContext:
        key = (repr(cfg), seed)
        if key not in self._ctx:
            self._ctx[key] = assembly.seed_context(cfg, self.splits(cfg), seed)
        return self._ctx[key]

    def test_set(self, cfg: ExperimentConfig, ctx: assembly.SeedContext) -> Any:
        """The run's test split, or the ``data`` spec's, loaded at the run's
        image size and channels with the run's other data options (its
        source's own options only when the source is the same); a class count
        other than the run's is one clear error."""
        if self.data is None:
            return ctx.splits.test  # type: ignore[union-attr]
        run = ctx.run
        same_source = self.data.partition(":")[0] == cfg.data.source.partition(":")[0]
        other = dataclasses.replace(
            cfg.data,
            source=self.data,
            options=cfg.data.options if same_source else {},
            channels=run.image_shape[0],
            image_size=run.image_shape[1],
        )
        test = self.splits(dataclasses.replace(cfg, data=other)).test
        if test.num_classes != run.num_classes:
            raise DataError(
                f"--data {self.data} has {test.num_classes} classes; the run's models score "
                f"{run.num_classes} ({', '.join(run.classes)})"
            )
        if tuple(test.image_shape) != tuple(run.image_shape):
            raise DataError(
                f"--data {self.data} gives images of shape {tuple(test.image_shape)}; the run's "
                f"models take {tuple(run.image_shape)}"
            )
        return test


def evaluate_run(
    run_dir: str | Path,
    data: str | None = None,
    *,
    method: str | None = None,
    device: str | None = None,
) -> list[Rescored]:
    """Score every kept model of ``run_dir`` again (of ``method`` only, when
    given) on the run's test split, or on the test split of the data spec
    ``data`` (``digits``, ``imagefolder:<dir>``, ...; the run's image size and
    normalisation). ``device`` overrides the config's. Nothing trains and
    nothing in ``run_dir`` is written. A model the sites scored (real sites:
    the server holds no test set) is skipped with a note."""
    root = Path(run_dir)
    if device is not None:
        try:
            assembly.resolve_device(device)
        except RuntimeError as e:  # torch's own words for a name it cannot parse
            raise ConfigError(f"--device {device!r}: {str(e).splitlines()[0]}") from None
    tasks = _Tasks(root, data, device)
    here = fingerprint_id(cpu_fingerprint())
    out = []
    for kept in kept_models(root, method):
        card = kept.card
        same_cpu = card.get("cpu_fingerprint") == here
        if card["scored_at"] != "server":
            out.append(_skipped(kept, "scored at the sites: the server holds no test set"))
            continue
        cfg, sha = tasks.config(card["sweep"])
        ctx = tasks.context(cfg, kept.seed)
        job = assembly.build_job(cfg, kept.method, ctx)
        predictor = _predictor(job, kept)
        test = tasks.test_set(cfg, ctx)
        scores = assembly.test_evaluator(test, job.run)(predictor)
        out.append(
            Rescored(
                kept.method,
                kept.seed,
                card["point"],
                card["accuracy"],
                float(scores["global_test_accuracy"]),
                int(scores["num_samples"]),
                same_config=sha == card["config_sha256"],
                same_cpu=same_cpu,
            )
        )
    return out


def _predictor(job: Job, kept: KeptModel) -> Any:
    """The method's predictor from the kept state; a state that no longer fits
    the model the run's config builds (an edited ``config.yaml``) is one line."""
    state = kept.state()
    try:
        return job.method.predictor(state)
    except (KeyError, RuntimeError, TypeError, ValueError) as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(
            f"{kept.path / STATE_FILE} does not fit the {kept.method} model the run's "
            f"config.yaml builds now ({why})"
        ) from e


def _skipped(kept: KeptModel, why: str) -> Rescored:
    card = kept.card
    return Rescored(
        kept.method, kept.seed, card["point"], card["accuracy"], None, None, True, True, why
    )
