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

:func:`evaluate_run` checks each kept model's files, card, record and grid
point first (:mod:`osfl.kept_files`: nothing outside the run directory is
followed, every file matches the card, the card matches ``metrics.json``),
rebuilds its task from the run's ``config.yaml`` through :mod:`osfl.assembly`
(the very functions the run used; nothing trains) and scores it on the run's
test split or another data spec's. On the machine that ran it the accuracy
equals the card's and the record's exactly; any difference is reported.
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
from osfl.config import ExperimentConfig, load_config_text, to_dict
from osfl.data.imageset import ImageSet
from osfl.data.sources.imagefolder import test_only_folder
from osfl.errors import ConfigError, DataError
from osfl.fl.fingerprint import cpu_fingerprint, fingerprint_id
from osfl.fl.runtime.base import Job, RunResult
from osfl.fl.state_codec import state_to_bytes
from osfl.interrupts import atomic_section
from osfl.kept_files import (
    CARD_FILE,
    CARD_FORMAT,
    CARD_VERSION,
    MAX_CONFIG_BYTES,
    MODEL_FILE,
    MODELS_DIR,
    STATE_FILE,
    KeptModel,
    duplicates,
    grid_point,
    model_folders,
    read_card,
    record_of,
    records_of,
    run_file,
)
from osfl.record import RunRecord

__all__ = [
    "CARD_FILE",
    "MODELS_DIR",
    "MODEL_FILE",
    "STATE_FILE",
    "KeptModel",
    "Rescored",
    "config_sha256",
    "evaluate_run",
    "keep_model",
    "kept_models",
]


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
    if result.state is None or record.global_test_accuracy is None:
        return None
    blobs = {STATE_FILE: state_to_bytes(result.state)}
    if isinstance(result.predictor, torch.nn.Module):
        blobs[MODEL_FILE] = save(_tensors_of(result.predictor))
    provenance = record.provenance or {}
    card = {
        "format": CARD_FORMAT,
        "version": CARD_VERSION,
        "method": job.method.name,
        "seed": job.seed,
        "point": record.point,
        "sweep": dict(record.sweep or {}),
        "config_sha256": config_sha256(cfg),
        "accuracy": record.global_test_accuracy,
        "test_samples": record.num_samples,
        "scored_at": "sites" if job.evaluate_at_clients else "server",
        "cpu_fingerprint": provenance.get("cpu_fingerprint"),
        "device": provenance.get("device"),
        "torch": provenance.get("torch"),
        "osfl_version": __version__,
        "code": code_version(),
        "files": {name: hashlib.sha256(blob).hexdigest() for name, blob in blobs.items()},
        "sizes": {name: len(blob) for name, blob in blobs.items()},
    }
    tmp = where.with_name(f".{where.name}.tmp")
    with atomic_section():  # Ctrl-C waits: the folder is the old one or the new one
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name, blob in blobs.items():
            (tmp / name).write_bytes(blob)
        (tmp / CARD_FILE).write_text(jsonio.dumps(card, indent=2) + "\n", encoding="utf-8")
        shutil.rmtree(where, ignore_errors=True)
        os.replace(tmp, where)
    return where


def kept_models(run_dir: str | Path, method: str | None = None) -> list[KeptModel]:
    """The kept models of ``run_dir`` (of ``method`` only, when given), in
    folder order, each card read and checked (:mod:`osfl.kept_files`); a
    clear error when there are none to score."""
    root = Path(run_dir)
    if not (root / "config.yaml").is_file():
        raise DataError(
            f"{root} is not an osfl run directory (no config.yaml); pass the directory "
            "`osfl run` printed"
        )
    folders = model_folders(root)
    if not folders:
        raise DataError(
            f"{root} keeps no models ({MODELS_DIR}/ is missing or empty): a run made before "
            "osfl kept models, or whose methods have no server model (local), has none; "
            "re-run it with this osfl"
        )
    found = [read_card(p, root) for p in folders]
    duplicates(found)
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
    """One kept model scored again: what its card and its run's record said
    and what it scores now (``accuracy`` ``None``: skipped, ``note`` says
    why). ``compared``: scored on the run's own test images (the content
    hash its record holds), so that the three accuracies must agree;
    ``problems``: every way they, or the model's files, disagree."""

    method: str
    seed: int
    point: str
    card_accuracy: float | None
    accuracy: float | None
    test_samples: int | None
    same_config: bool
    same_cpu: bool
    note: str = ""
    record_accuracy: float | None = None
    compared: bool = True
    problems: tuple[str, ...] = ()
    data_note: str = ""

    @property
    def equal(self) -> bool:
        """Whether the accuracy now is exactly the card's and the record's,
        on the run's own test images, with nothing else amiss."""
        return self.accuracy is not None and self.compared and not self.problems


@dataclass(frozen=True)
class _TestData:
    """The images a model is scored on, and the line that says what they are."""

    images: ImageSet
    note: str = ""


class _Tasks:
    """The run's tasks rebuilt from its ``config.yaml`` (read once, from
    inside the run directory), each loaded once: the config of a grid point,
    its data, a seed's context, the test data."""

    def __init__(self, root: Path, data: str | None, device: str | None, everything: bool = False):
        self.root, self.data, self.device, self.everything = root, data, device, everything
        self.text = run_file(root, "config.yaml", max_bytes=MAX_CONFIG_BYTES)
        self.stored = self._load([])
        self._splits: dict[str, Any] = {}
        self._ctx: dict[tuple[str, int], assembly.SeedContext] = {}
        self._test: dict[tuple[str, str], _TestData] = {}

    def _load(self, overrides: list[str]) -> ExperimentConfig:
        try:
            return assembly.resolve_parallel(load_config_text(self.text, overrides))
        except ConfigError as e:
            raise ConfigError(f"{self.root}/config.yaml does not load ({e})") from e

    def config(self, kept: KeptModel) -> tuple[ExperimentConfig, str]:
        """The config of ``kept``'s grid point (the run's own point, which its
        card only names; on ``device`` when given) and the
        :func:`config_sha256` of the config the run resolved it to."""
        point = grid_point(self.stored, kept)
        cfg = self._load([f"{k}={v}" for k, v in point.items()])
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

    def test_set(self, cfg: ExperimentConfig, ctx: assembly.SeedContext) -> _TestData:
        """The run's test split, or the ``data`` spec's images (:func:`_other_data`)."""
        if self.data is None:
            return _TestData(ctx.splits.test)  # type: ignore[union-attr]
        key = (repr(cfg.data), repr(ctx.run.classes))
        if key not in self._test:
            self._test[key] = _other_data(self, cfg, ctx)
        return self._test[key]


def _other_data(tasks: _Tasks, cfg: ExperimentConfig, ctx: assembly.SeedContext) -> _TestData:
    """The images of ``--data SPEC`` a model is scored on, at the run's image
    size and channels, with the run's class names in the run's label order.

    Its test split, unless the spec names an image folder holding only
    ``test/`` (all of its images: issue 52, a test folder is the user's test
    data) or ``--all`` asks for every image (train and test parts). The run's
    other data options apply only to the run's own spec: a per-class cap or
    a validation share must not shrink a user's data in silence. What was
    scored is said in one line, with the count of what was not."""
    spec, run = str(tasks.data), ctx.run
    only_test = test_only_folder(spec)
    source = f"imagefolder:{only_test}" if only_test is not None else spec
    same = source.strip() == cfg.data.source.strip()
    other = dataclasses.replace(
        cfg.data,
        source=source,
        options=cfg.data.options if same else {},
        max_per_class=cfg.data.max_per_class if same else None,
        validation_fraction=cfg.data.validation_fraction if same else 0.0,
        channels=run.image_shape[0],
        image_size=run.image_shape[1],
    )
    splits = tasks.splits(dataclasses.replace(cfg, data=other))
    parts = [p for p in (splits.train, splits.validation, splits.test) if p is not None]
    total = sum(len(p) for p in parts)
    if only_test is not None or tasks.everything:
        test = _joined(parts)
        what = "holds only test/: scored all" if only_test is not None else "--all: scored all"
        note = (
            f"{spec} {what} {total} of its images"
            if only_test
            else f"{what} {total} images of {spec}"
        )
    else:
        test = splits.test
        note = f"scored the test part of {spec}: {len(test)} of its {total} images" + (
            f" (--all scores all {total})" if len(test) < total else ""
        )
    return _TestData(_as_run_classes(test, run, spec), note)


def _joined(parts: list[ImageSet]) -> ImageSet:
    """One ImageSet of ``parts`` (one source's splits: same classes and shape)."""
    first = parts[0]
    return ImageSet(
        images=torch.cat([p.images for p in parts]),
        labels=torch.cat([p.labels for p in parts]),
        classes=first.classes,
        name=first.name,
    )


def _as_run_classes(test: ImageSet, run: Any, spec: str) -> ImageSet:
    """``test`` labelled in the run's class order; other class names (not
    only another count) are one clear error: a model scored on classes it
    never learnt scores chance without a word."""
    if test.num_classes != run.num_classes:
        raise DataError(
            f"--data {spec} has {test.num_classes} classes; the run's models score "
            f"{run.num_classes} ({', '.join(run.classes)})"
        )
    if sorted(test.classes) != sorted(run.classes):
        extra = [c for c in test.classes if c not in run.classes]
        raise DataError(
            f"--data {spec} has other classes than the run's: {', '.join(extra[:3])}"
            f"{' ...' if len(extra) > 3 else ''} not among the run's "
            f"({', '.join(run.classes)}); name its class folders as the run's classes"
        )
    if tuple(test.classes) != tuple(run.classes):
        order = torch.tensor([list(run.classes).index(c) for c in test.classes])
        test = ImageSet(test.images, order[test.labels], tuple(run.classes), name=test.name)
    if tuple(test.image_shape) != tuple(run.image_shape):
        raise DataError(
            f"--data {spec} gives images of shape {tuple(test.image_shape)}; the run's "
            f"models take {tuple(run.image_shape)}"
        )
    return test


def evaluate_run(
    run_dir: str | Path,
    data: str | None = None,
    *,
    method: str | None = None,
    device: str | None = None,
    everything: bool = False,
) -> list[Rescored]:
    """Score every kept model of ``run_dir`` again (of ``method`` only, when
    given) on the run's test split, or on the data spec ``data``
    (``digits``, ``imagefolder:<dir>``, ...; its test split, a folder of
    ``test/`` alone in full, every image with ``everything``; the run's image
    size and normalisation). ``device`` overrides the config's. Each model's
    files, card and record are checked first (:mod:`osfl.kept_files`).
    Nothing trains and nothing in ``run_dir`` is written. A model the sites
    scored (real sites: the server holds no test set) is skipped with a note."""
    root = Path(run_dir)
    if device is not None:
        try:
            assembly.resolve_device(device)
        except RuntimeError as e:  # torch's own words for a name it cannot parse
            raise ConfigError(f"--device {device!r}: {str(e).splitlines()[0]}") from None
    if everything and data is None:
        raise ConfigError(
            "--all scores every image of --data SPEC; give --data (the run's own train "
            "images are what its clients trained on)"
        )
    models = kept_models(root, method)
    records = records_of(root)
    tasks = _Tasks(root, data, device, everything)
    here = fingerprint_id(cpu_fingerprint())
    out = []
    for kept in models:
        record = record_of(records, kept)
        if kept.card["scored_at"] != "server":
            out.append(_skipped(kept, "scored at the sites: the server holds no test set"))
            continue
        out.append(_rescore(tasks, kept, record, here))
    return out


def _rescore(tasks: _Tasks, kept: KeptModel, record: RunRecord, here: str) -> Rescored:
    """Score one verified model and compare it with its card and record."""
    card = kept.card
    cfg, sha = tasks.config(kept)
    ctx = tasks.context(cfg, kept.seed)
    job = assembly.build_job(cfg, kept.method, ctx)
    predictor = _predictor(job, kept)
    kept.check_weights(predictor)
    test = tasks.test_set(cfg, ctx)
    scores = assembly.test_evaluator(test.images, job.run)(predictor)
    accuracy = float(scores["global_test_accuracy"])
    recorded = record.global_test_accuracy
    held = record.test_set
    compared = tasks.data is None or test.images.fingerprint() == held
    problems = _differences(card, record, accuracy, int(scores["num_samples"]), compared)
    if tasks.data is None and isinstance(held, str) and test.images.fingerprint() != held:
        problems.append("the run's test images are not those its record was scored on")
    return Rescored(
        kept.method,
        kept.seed,
        card["point"],
        card["accuracy"],
        accuracy,
        int(scores["num_samples"]),
        same_config=sha == card["config_sha256"],
        same_cpu=card.get("cpu_fingerprint") == here,
        record_accuracy=recorded,
        compared=compared,
        problems=tuple(problems),
        data_note=test.note,
    )


def _differences(
    card: Mapping[str, Any], record: RunRecord, accuracy: float, samples: int, compared: bool
) -> list[str]:
    """How the card, the record and (on the run's own test images) the
    accuracy now disagree, one phrase each."""
    out = []
    recorded = record.global_test_accuracy
    if card["accuracy"] != recorded:
        out.append("the card's accuracy differs from metrics.json's")
    if compared and accuracy != card["accuracy"]:
        out.append("the accuracy now differs from the card's")
    if compared and accuracy != recorded:
        out.append("the accuracy now differs from metrics.json's")
    if compared and record.num_samples not in (None, samples):
        out.append(f"{samples} test images, metrics.json says {record.num_samples}")
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
            f"config.yaml builds now ({why[:200]})"
        ) from e


def _skipped(kept: KeptModel, why: str) -> Rescored:
    card = kept.card
    return Rescored(
        kept.method, kept.seed, card["point"], card["accuracy"], None, None, True, True, why
    )
