"""``osfl run``'s work (``osfl.runner``) on resume: a run started with the live
display resumes with ``--no-progress`` (any key that changes a number is still
refused), and ``--resume`` finishes a run only on the clients it started with
(issue 51): the config text can be the same while a file it names holds
other content. The issue's case: a run with ``partition.from_file=p.json``
stopped after its first method, ``p.json`` was replaced by another valid
split, and ``--resume`` finished the run on it, one method on each split.
Now the finished records' partition key (it covers every index) and data
hashes are compared with the new plan's, and a difference is one line
naming what changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from PIL import Image

from osfl.cli import main
from osfl.config import load_config
from osfl.data.partition import make_federation
from support.smoke import exit_2, tiny_cli_args
from support.tiny import TINY_RESUME


def _split(out: Path, seed: int) -> Path:
    argv = ["partition", "--dataset", "digits", "--scheme", "iid", "--clients", "2"]
    assert main([*argv, "--seed", str(seed), "--out", str(out)]) == 0
    return out


def _stop_after_the_first_method(run: Path) -> None:
    """What a run killed during its second method leaves: the first record."""
    doc = json.loads((run / "metrics.json").read_text())
    doc["records"] = doc["records"][:1]
    (run / "metrics.json").write_text(json.dumps(doc))
    shutil.rmtree(run / "models" / "ensemble-seed0")


def test_a_replaced_split_file_is_named_and_the_run_not_finished(tmp_path, capsys) -> None:
    p = _split(tmp_path / "p.json", 0)
    kept = p.read_bytes()
    run = tmp_path / "run"
    args = [*TINY_RESUME, f"partition.from_file={p}", f"cache_dir={tmp_path / 'cache'}"]
    assert main(["run", *args, "--out", str(run), "--no-progress"]) == 0
    _stop_after_the_first_method(run)
    before = (run / "metrics.json").read_bytes()
    _split(p, 1)  # another valid split in its place
    line = exit_2(capsys, ["run", "--resume", str(run), "--no-progress"])
    assert f"partition.from_file={p} now holds another split" in line
    assert "than fedavg seed 0 trained on" in line and "start a new run" in line
    assert (run / "metrics.json").read_bytes() == before  # nothing run, nothing lost
    p.write_bytes(kept)  # the split it started with: the run finishes
    assert main(["run", "--resume", str(run), "--no-progress"]) == 0
    methods = [r["method"] for r in json.loads((run / "metrics.json").read_text())["records"]]
    assert methods == ["fedavg", "ensemble"]


def test_changed_images_under_the_same_labels_are_named(tmp_path, capsys) -> None:
    """An image folder whose pixels changed keeps its labels, so its
    partition key; the train set's content hash tells."""
    rng = np.random.default_rng(0)
    root = tmp_path / "folder"
    for split in ("train", "test"):
        for c in ("ant", "bee"):
            (root / split / c).mkdir(parents=True)
            for i in range(6):
                pixels = rng.integers(0, 255, (8, 8), dtype=np.uint8)
                Image.fromarray(pixels, mode="L").save(root / split / c / f"{i}.png")
    run = tmp_path / "run"
    args = [
        *TINY_RESUME,
        f"data.source=imagefolder:{root}",
        "data.channels=1",
        "partition.scheme=iid",
        "cache_dir=null",
    ]
    assert main(["run", *args, "--out", str(run), "--no-progress"]) == 0
    _stop_after_the_first_method(run)
    Image.fromarray(np.zeros((8, 8), np.uint8), mode="L").save(root / "train" / "ant" / "0.png")
    line = exit_2(capsys, ["run", "--resume", str(run), "--no-progress"])
    assert f"data.source=imagefolder:{root} now holds other train images" in line


def test_an_older_record_s_recipe_key_is_accepted_only_for_a_drawn_split() -> None:
    """Before the key covered the indices it hashed the recipe: a record of
    that osfl resumes where the recipe fixes the indices (a drawn split),
    not where a file holds them; a record without a key is not compared."""
    from osfl.runner import _clients_differ

    fed = make_federation(np.repeat(np.arange(4), 10), "iid", 2, 0)
    ctx = SimpleNamespace(federation=fed, splits=None)
    drawn, saved = load_config(None), load_config(None, ["partition.from_file=p.json"])
    old = {"method": "fedavg", "seed": 0, "partition": {"key": fed.recipe_key()}}
    assert _clients_differ(old, drawn, ctx) is None
    assert "partition.from_file=p.json now holds another split" in str(
        _clients_differ(old, saved, ctx)
    )
    new = {"method": "fedavg", "seed": 0, "partition": {"key": fed.key()}}
    assert _clients_differ(new, saved, ctx) is None
    assert _clients_differ({"method": "fedavg", "seed": 0}, saved, ctx) is None
    other = {"method": "fedavg", "seed": 0, "partition": {"key": "0" * 24}}
    assert "the clients' split is another now" in str(_clients_differ(other, drawn, ctx))


def test_a_resume_may_differ_in_the_progress_display_only(tmp_path: Path, capsys) -> None:
    """A run started with the live display resumes with ``--no-progress``;
    any key that changes a number is still refused."""
    out = tmp_path / "run"
    args = tiny_cli_args(tmp_path, "fedavg,local", progress=True)
    assert main(["run", *args, "--out", str(out)]) == 0
    doc = json.loads((out / "metrics.json").read_text())
    doc["records"] = doc["records"][:1]  # "stopped" after the first method
    (out / "metrics.json").write_text(json.dumps(doc))
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0
    assert len(json.loads((out / "metrics.json").read_text())["records"]) == 2
    line = exit_2(capsys, ["run", "--resume", str(out), "train.epochs=3"])
    assert "train.epochs (3 here, 1 in the run)" in line and "progress" not in line
