"""A kept model's files are checked before anything is loaded (``osfl.kept_files``,
issue 51): every file is the run's own (no link, nothing outside the run
directory, no FIFO), matches the digest and size its card records, a card
cannot choose the task or claim another model, and a card resealed by a
forger still disagrees with ``metrics.json``. Re-scoring itself is
``tests/test_kept_model.py``'s."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save

from osfl.cli import main
from osfl.errors import DataError
from osfl.fl.state_codec import state_from_bytes, state_to_bytes
from osfl.kept_model import CARD_FILE, MODEL_FILE, STATE_FILE, evaluate_run
from support.kept import card, records, reseal


@pytest.fixture
def run(kept_run: Path) -> Path:
    """The root conftest's run of fedavg, ensemble and local, read only."""
    return kept_run


@pytest.fixture
def copy(run: Path, tmp_path: Path) -> Path:
    """A copy of the run to damage."""
    return Path(shutil.copytree(run, tmp_path / "run"))


def test_a_damaged_or_missing_state_is_named_and_never_loaded(copy: Path) -> None:
    state = copy / "models" / "fedavg-seed0" / STATE_FILE
    blob = bytearray(state.read_bytes())
    blob[-1] ^= 0xFF
    state.write_bytes(bytes(blob))
    with pytest.raises(DataError, match=r"state\.safetensors is damaged \(its sha256 differs"):
        evaluate_run(copy, method="fedavg")
    state.unlink()
    with pytest.raises(DataError, match=r"state\.safetensors does not exist"):
        evaluate_run(copy, method="fedavg")


def test_a_damaged_card_is_refused(copy: Path) -> None:
    path = copy / "models" / "ensemble-seed0" / CARD_FILE
    path.write_text("{not json")
    with pytest.raises(DataError, match=r"card\.json is not valid JSON"):
        evaluate_run(copy)
    path.write_text(json.dumps({**card(copy, "fedavg-seed0"), "seed": "zero"}))
    with pytest.raises(DataError, match=r"field 'seed' missing or of the wrong type"):
        evaluate_run(copy)


def test_every_file_of_a_kept_model_is_verified(copy: Path) -> None:
    """The weights file was never checked: a truncated, flipped, deleted or
    resealed ``model.safetensors`` still gave "equal: yes"."""
    folder = copy / "models" / "fedavg-seed0"
    blob = (folder / MODEL_FILE).read_bytes()
    cases = [
        (blob[: len(blob) // 2], r"model\.safetensors is damaged \(\d+ bytes, the card says"),
        (blob[:-1] + bytes([blob[-1] ^ 1]), r"model\.safetensors is damaged \(its sha256"),
    ]
    for bad, says in cases:
        (folder / MODEL_FILE).write_bytes(bad)
        with pytest.raises(DataError, match=says):
            evaluate_run(copy, method="fedavg")
    (folder / MODEL_FILE).unlink()
    with pytest.raises(DataError, match=r"model\.safetensors does not exist"):
        evaluate_run(copy, method="fedavg")


def test_resealed_weights_are_not_the_model_the_state_rebuilds(copy: Path) -> None:
    folder = copy / "models" / "fedavg-seed0"
    weights = load_file(folder / MODEL_FILE)
    largest = max(weights, key=lambda k: weights[k].numel())
    weights[largest] = torch.zeros_like(weights[largest])
    reseal(folder, MODEL_FILE, save(weights))
    with pytest.raises(DataError, match=r"model\.safetensors holds other weights than the model"):
        evaluate_run(copy, method="fedavg")


def test_a_resealed_state_and_card_still_disagree_with_metrics_json(copy: Path, capsys) -> None:
    """The issue's forgery: the largest weight zeroed, state, weights and card
    resealed with the new accuracy. The card agrees with the model; the
    record does not, and the command exits 1 saying so."""
    folder = copy / "models" / "fedavg-seed0"
    state = state_from_bytes((folder / STATE_FILE).read_bytes())
    largest = max(state, key=lambda k: state[k].numel())
    state[largest] = torch.zeros_like(state[largest])
    reseal(folder, STATE_FILE, state_to_bytes(state))
    weights = load_file(folder / MODEL_FILE)  # the predictor's: the model under "model."
    weights[f"model.{largest}"] = torch.zeros_like(weights[f"model.{largest}"])
    reseal(folder, MODEL_FILE, save(weights))
    (now,) = evaluate_run(copy, method="fedavg", device="cpu")
    reseal(folder, MODEL_FILE, save(weights), accuracy=now.accuracy)
    (row,) = evaluate_run(copy, method="fedavg")
    recorded = {r["method"]: r for r in records(copy)}["fedavg"]["global_test_accuracy"]
    assert row.accuracy == row.card_accuracy != row.record_accuracy == recorded
    assert not row.equal
    assert row.problems == (
        "the card's accuracy differs from metrics.json's",
        "the accuracy now differs from metrics.json's",
    )
    capsys.readouterr()
    assert main(["eval", str(copy), "--method", "fedavg"]) == 1
    out = capsys.readouterr().out
    assert "fedavg seed 0 differs: the card's accuracy differs from metrics.json's" in out
    assert [line.split()[-2] for line in out.splitlines() if "│ fedavg" in line] == ["no"]


def test_nothing_outside_the_run_directory_is_followed(copy: Path, run: Path) -> None:
    models = copy / "models"
    shutil.rmtree(models)
    models.symlink_to(run / "models")  # another run's models
    with pytest.raises(DataError, match=r"models is a symbolic link: refusing to follow it"):
        evaluate_run(copy)
    models.unlink()
    models.mkdir()
    (models / "fedavg-seed0").symlink_to(run / "models" / "fedavg-seed0")
    with pytest.raises(DataError, match="is a symbolic link: a kept model must be the run's own"):
        evaluate_run(copy)
    (models / "fedavg-seed0").unlink()
    shutil.copytree(run / "models" / "fedavg-seed0", models / "fedavg-seed0")
    state = models / "fedavg-seed0" / STATE_FILE
    state.unlink()
    state.symlink_to("/dev/zero")  # was a MemoryError
    with pytest.raises(DataError, match=r"state\.safetensors is a symbolic link"):
        evaluate_run(copy)
    state.unlink()
    os.mkfifo(state)
    with pytest.raises(DataError, match=r"state\.safetensors is a FIFO \(named pipe\)"):
        evaluate_run(copy)


def test_a_card_cannot_choose_the_task_or_claim_another_model(copy: Path) -> None:
    """A card's ``sweep`` was applied as config overrides, so a card could set
    ``data.source``; now it can only name one of config.yaml's grid points."""
    path = copy / "models" / "fedavg-seed0" / CARD_FILE
    good = json.loads(path.read_text())
    path.write_text(json.dumps({**good, "sweep": {"data.source": "imagefolder:/etc"}}))
    with pytest.raises(DataError, match=r"names grid point 'data\.source=imagefolder:/etc', which"):
        evaluate_run(copy, method="fedavg")
    path.write_text(json.dumps({**good, "files": {**good["files"], "../../x": "0" * 64}}))
    with pytest.raises(DataError, match=r"files must be state\.safetensors"):
        evaluate_run(copy, method="fedavg")
    path.write_text(json.dumps(good))
    shutil.copytree(copy / "models" / "fedavg-seed0", copy / "models" / "fedavg-seed0-copy")
    with pytest.raises(DataError, match="both claim fedavg seed 0"):
        evaluate_run(copy)
    shutil.rmtree(copy / "models" / "fedavg-seed0-copy")
    doc = json.loads((copy / "metrics.json").read_text())
    doc["records"] = [r for r in doc["records"] if r["method"] != "fedavg"]
    (copy / "metrics.json").write_text(json.dumps(doc))
    with pytest.raises(DataError, match=r"metrics\.json holds no record of fedavg seed 0"):
        evaluate_run(copy, method="fedavg")


def test_new_cards_record_each_files_size(run: Path) -> None:
    folder = run / "models" / "fedavg-seed0"
    sizes = card(run, "fedavg-seed0")["sizes"]
    assert sizes == {f: (folder / f).stat().st_size for f in (STATE_FILE, MODEL_FILE)}
