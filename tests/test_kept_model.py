"""Every run keeps each method's final server model (state, weights, card),
and :func:`osfl.kept_model.evaluate_run` scores it again, without training,
to exactly the accuracy its record holds (issue 44). The checks of its files
before anything is loaded are ``tests/test_kept_files.py``'s."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from osfl import assembly
from osfl.cli import main
from osfl.config import load_config
from osfl.errors import ConfigError, DataError
from osfl.fl.state_codec import state_from_bytes
from osfl.kept_model import (
    CARD_FILE,
    MODEL_FILE,
    STATE_FILE,
    config_sha256,
    evaluate_run,
    kept_models,
)
from support.kept import card, records
from support.smoke import tiny_cli_args


@pytest.fixture
def run(kept_run: Path) -> Path:
    """The root conftest's run of fedavg, ensemble and local (which has no
    server model), read only."""
    return kept_run


@pytest.fixture
def copy(run: Path, tmp_path: Path) -> Path:
    """A copy of the run to damage."""
    return Path(shutil.copytree(run, tmp_path / "run"))


def test_each_server_model_is_kept_with_a_card_that_matches_its_record(run: Path) -> None:
    assert sorted(p.name for p in (run / "models").iterdir()) == ["ensemble-seed0", "fedavg-seed0"]
    by_method = {r["method"]: r for r in records(run)}
    assert by_method["local"]["global_test_accuracy"] is None  # nothing to keep
    cfg = assembly.resolve_parallel(load_config(run / "config.yaml"))
    for name in ("fedavg", "ensemble"):
        folder = run / "models" / f"{name}-seed0"
        c, rec = card(run, f"{name}-seed0"), by_method[name]
        assert sorted(p.name for p in folder.iterdir()) == [CARD_FILE, MODEL_FILE, STATE_FILE]
        assert (c["method"], c["seed"], c["point"], c["sweep"]) == (name, 0, "", {})
        assert c["accuracy"] == rec["global_test_accuracy"]
        assert c["test_samples"] == rec["num_samples"] == 451
        assert c["cpu_fingerprint"] == rec["provenance"]["cpu_fingerprint"]
        assert (c["device"], c["scored_at"], c["osfl_version"]) == ("cpu", "server", "0.1.0")
        assert c["config_sha256"] == config_sha256(cfg)
        for f in (STATE_FILE, MODEL_FILE):
            assert c["files"][f] == hashlib.sha256((folder / f).read_bytes()).hexdigest()


def test_the_weights_file_is_the_predictor_the_state_rebuilds(run: Path) -> None:
    cfg = load_config(run / "config.yaml")
    ctx = assembly.seed_context(cfg, assembly.load_splits(cfg), 0)
    for name in ("fedavg", "ensemble"):
        folder = run / "models" / f"{name}-seed0"
        state = state_from_bytes((folder / STATE_FILE).read_bytes())
        want = assembly.build_job(cfg, name, ctx).method.predictor(state).state_dict()
        got = load_file(folder / MODEL_FILE)
        assert sorted(got) == sorted(want) and len(got) > 0
        assert all(torch.equal(got[k], want[k]) for k in want)


def test_rescoring_gives_the_records_accuracy_exactly(run: Path) -> None:
    by_method = {r["method"]: r for r in records(run)}
    rows = evaluate_run(run)
    assert [(r.method, r.seed) for r in rows] == [("ensemble", 0), ("fedavg", 0)]
    for r in rows:
        assert r.accuracy == r.card_accuracy == by_method[r.method]["global_test_accuracy"]
        assert r.equal and r.same_cpu and r.same_config and r.test_samples == 451
    assert [r.method for r in evaluate_run(run, method="fedavg")] == ["fedavg"]
    assert (run / "models" / "fedavg-seed0").is_dir()  # scoring writes nothing


def _folder_of(test_images: torch.Tensor, labels: torch.Tensor, root: Path) -> Path:
    """An image folder holding ``test_images`` (grey, uint8) as its test and train splits."""
    for split in ("train", "test"):
        for i, (img, y) in enumerate(zip(test_images, labels, strict=True)):
            d = root / split / str(int(y))
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img[0].numpy(), mode="L").save(d / f"{i:04d}.png")
    return root


def test_the_run_test_split_as_an_image_folder_scores_the_same(run: Path, tmp_path: Path) -> None:
    cfg = load_config(run / "config.yaml")
    test = assembly.load_splits(cfg).test
    folder = _folder_of(test.images, test.labels, tmp_path / "copy")
    rows = evaluate_run(run, f"imagefolder:{folder}", method="fedavg")
    assert [(r.accuracy == r.card_accuracy, r.test_samples) for r in rows] == [(True, 451)]


def test_half_of_the_test_split_scores_what_that_half_scores(run: Path, tmp_path: Path) -> None:
    cfg = load_config(run / "config.yaml")
    ctx = assembly.seed_context(cfg, assembly.load_splits(cfg), 0)
    half = ctx.splits.test.subset(np.arange(0, 451, 2))
    folder = _folder_of(half.images, half.labels, tmp_path / "half")
    (kept,) = kept_models(run, "fedavg")
    job = assembly.build_job(cfg, "fedavg", ctx)
    with torch.no_grad():
        predictor = job.method.predictor(kept.state()).eval()
        predicted = predictor(job.run.eval_transform(half.images))
    want = int((predicted.argmax(1) == half.labels).sum()) / len(half)
    (row,) = evaluate_run(run, f"imagefolder:{folder}", method="fedavg")
    assert (row.accuracy, row.test_samples, row.card_accuracy) == (want, 226, kept.card["accuracy"])


def test_other_data_with_another_class_count_is_refused(run: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in ("ant", "bee"):
            (tmp_path / "two" / split / c).mkdir(parents=True)
            for i in range(3):
                pixels = rng.integers(0, 255, (8, 8), dtype=np.uint8)
                Image.fromarray(pixels, mode="L").save(tmp_path / "two" / split / c / f"{i}.png")
    with pytest.raises(DataError) as e:
        evaluate_run(run, f"imagefolder:{tmp_path / 'two'}")
    assert str(e.value) == (
        f"--data imagefolder:{tmp_path / 'two'} has 2 classes; the run's models score 10 "
        "(0, 1, 2, 3, 4, 5, 6, 7, 8, 9)"
    )


def test_no_models_or_no_model_of_the_method_is_one_clear_error(copy: Path) -> None:
    with pytest.raises(ConfigError) as e:
        evaluate_run(copy, method="local")
    assert str(e.value) == (
        f"--method local: {copy} keeps no model of it (kept: ensemble, fedavg; a method "
        "without a server model, e.g. local, keeps none)"
    )
    shutil.rmtree(copy / "models")
    with pytest.raises(DataError, match=r"keeps no models \(models/ is missing or empty\)"):
        evaluate_run(copy)
    (copy / "models" / ".fedavg-seed0.tmp").mkdir(parents=True)  # a write that never finished
    with pytest.raises(DataError, match=r"keeps no models \(models/ is missing or empty\)"):
        evaluate_run(copy)
    with pytest.raises(DataError, match=r"is not an osfl run directory \(no config\.yaml\)"):
        evaluate_run(copy / "models")


def test_a_device_torch_cannot_parse_is_one_line(run: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--device 'gpu0': "):
        evaluate_run(run, device="gpu0")


def test_a_model_the_sites_scored_is_skipped_with_a_note(copy: Path) -> None:
    path = copy / "models" / "fedavg-seed0" / CARD_FILE
    path.write_text(json.dumps({**card(copy, "fedavg-seed0"), "scored_at": "sites"}))
    (row,) = evaluate_run(copy, method="fedavg")
    assert (row.accuracy, row.equal) == (None, False)
    assert row.note == "scored at the sites: the server holds no test set"


def test_the_config_hash_ignores_what_only_changes_how_a_run_goes() -> None:
    base = load_config(None, ["train.lr=0.05"])
    same = load_config(None, ["train.lr=0.05", "progress=false", "methods=[fedavg]", "seeds=[3]"])
    assert config_sha256(base) == config_sha256(same)
    assert config_sha256(base) != config_sha256(load_config(None, ["train.lr=0.1"]))
    assert len(config_sha256(base)) == 16


def test_a_resumed_run_keeps_the_models_of_jobs_finished_before(copy: Path) -> None:
    doc = json.loads((copy / "metrics.json").read_text())
    doc["records"] = [r for r in doc["records"] if r["method"] != "ensemble"]
    (copy / "metrics.json").write_text(json.dumps(doc))
    shutil.rmtree(copy / "models" / "ensemble-seed0")
    fedavg = copy / "models" / "fedavg-seed0"
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in fedavg.iterdir()}
    assert main(["run", "--resume", str(copy), "--no-progress"]) == 0
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in fedavg.iterdir()} == before
    rows = evaluate_run(copy)
    assert [(r.method, r.equal) for r in rows] == [("ensemble", True), ("fedavg", True)]


def test_each_grid_point_keeps_its_model(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    args = tiny_cli_args(tmp_path, "fedavg")
    assert main(["run", *args, "--sweep", "train.lr=0.05,0.2", "--out", str(out)]) == 0
    names = sorted(p.name for p in (out / "models").iterdir())
    assert names == ["fedavg-seed0-train.lr_0.05", "fedavg-seed0-train.lr_0.2"]
    assert card(out, names[1])["sweep"] == {"train.lr": "0.2"}
    rows = evaluate_run(out)
    want = {r["point"]: r["global_test_accuracy"] for r in records(out)}
    assert {r.point: r.accuracy for r in rows} == want
    assert all(r.equal for r in rows) and len(want) == 2


def _named_folder(run: Path, root: Path, names: list[str] | None, layout: str) -> Path:
    """The run's test images as an image folder: ``test/<class>/`` alone
    (``layout="test"``) or ``<class>/`` (``""``), classes named ``names``."""
    cfg = load_config(run / "config.yaml")
    test = assembly.load_splits(cfg).test
    for i, (img, y) in enumerate(zip(test.images, test.labels, strict=True)):
        d = root / layout / (names[int(y)] if names else str(int(y)))
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img[0].numpy(), mode="L").save(d / f"{i:04d}.png")
    return root


def test_a_test_only_folder_is_scored_in_full(run: Path, tmp_path: Path) -> None:
    """Issue 52: ``test/<class>/`` alone was read as a domain "test" and
    split 80/20, so 90 of 451 images were scored without a word."""
    folder = _named_folder(run, tmp_path / "t", None, "test")
    (row,) = evaluate_run(run, f"imagefolder:{folder}", method="fedavg")
    assert row.test_samples == 451 and row.accuracy == row.card_accuracy
    assert row.data_note == f"imagefolder:{folder} holds only test/: scored all 451 of its images"
    assert not row.compared and not row.problems  # other files: nothing to hold it to


def test_a_split_eval_makes_is_said_and_all_scores_everything(run: Path, tmp_path: Path) -> None:
    folder = _named_folder(run, tmp_path / "c", None, "")
    (row,) = evaluate_run(run, f"imagefolder:{folder}", method="fedavg")
    assert row.test_samples == 90 < 451
    assert row.data_note == (
        f"scored the test part of imagefolder:{folder}: 90 of its 451 images (--all scores all 451)"
    )
    (whole,) = evaluate_run(run, f"imagefolder:{folder}", method="fedavg", everything=True)
    assert (whole.test_samples, whole.accuracy) == (451, whole.card_accuracy)
    with pytest.raises(ConfigError, match="--all scores every image of --data SPEC"):
        evaluate_run(run, everything=True)


def test_class_names_are_compared_not_only_their_count(run: Path, tmp_path: Path) -> None:
    """Right count, other names: it scored 1.33 % without a word."""
    letters = [chr(ord("a") + i) for i in range(10)]
    folder = _named_folder(run, tmp_path / "n", letters, "test")
    with pytest.raises(DataError, match=r"has other classes than the run's: a, b, c \.\.\. not"):
        evaluate_run(run, f"imagefolder:{folder}", method="fedavg")


def test_the_same_names_in_another_order_are_relabelled() -> None:
    """Labels are indices into each set's own class list: data whose folders
    sort into another order than the run's labels is relabelled by name."""
    from types import SimpleNamespace

    from osfl.data.imageset import ImageSet
    from osfl.kept_model import _as_run_classes

    images = torch.zeros(3, 1, 4, 4, dtype=torch.uint8)
    other = ImageSet(images, torch.tensor([0, 1, 1]), ("bee", "ant"))
    run = SimpleNamespace(num_classes=2, classes=("ant", "bee"), image_shape=(1, 4, 4))
    mapped = _as_run_classes(other, run, "x")
    assert mapped.classes == ("ant", "bee") and mapped.labels.tolist() == [1, 0, 0]
    assert _as_run_classes(mapped, run, "x") is mapped  # the run's order: untouched
