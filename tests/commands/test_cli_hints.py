"""A new user's small mistakes get one line that names the fix (exit 2,
nothing written): a CIFAR config without its data folder, a repository config
read from another directory, an empty class folder; and ``-v`` works after
the command as well as before it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from PIL import Image

from osfl.cli import main
from support.cli import error_line
from support.paths import ROOT
from support.smoke import tiny_cli_args


def tiny(tmp_path: Path) -> list[str]:
    return tiny_cli_args(tmp_path, "fedavg")


def test_a_cifar_config_without_its_folder_names_osfl_cifar10(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no data/cifar10 here
    monkeypatch.delenv("OSFL_CIFAR10", raising=False)
    config = str(ROOT / "configs" / "fafi_cifar10_cpu.yaml")
    line = error_line(capsys, ["run", config, "--out", "run"])
    assert "directory 'data/cifar10' does not exist" in line
    assert "set OSFL_CIFAR10 to your CIFAR-10 image folder" in line
    assert "link it to data/cifar10" in line
    # the variable set, to a folder that is not there: it is the variable to fix
    monkeypatch.setenv("OSFL_CIFAR10", str(tmp_path / "cifar"))
    line = error_line(capsys, ["run", config, "--out", "run"])
    assert f"{tmp_path / 'cifar'}' does not exist; OSFL_CIFAR10 names it" in line
    assert not (tmp_path / "run").exists()
    # any other missing folder: the spec is what to fix
    line = error_line(capsys, ["run", f"data.source=imagefolder:{tmp_path / 'x'}"])
    assert line.endswith("does not exist; check the path in the spec")


def test_the_repository_configs_from_another_directory_say_where_they_are(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    line = error_line(capsys, ["run", "configs/default.yaml"])
    assert f"config file not found: configs/default.yaml (relative to {tmp_path})" in line
    assert "a bare `osfl run` (no config file) runs the packaged default" in line
    line = error_line(capsys, ["run", "configs/kd_digits.yaml"])
    assert "configs/ is in the osfl checkout: run from its root or give the full path" in line
    line = error_line(capsys, ["run", str(tmp_path / "mine.yaml")])
    assert line == f"osfl: error: config file not found: {tmp_path / 'mine.yaml'}"


def _folder(root: Path, classes: dict[str, int]) -> Path:
    for c, n in classes.items():
        (root / c).mkdir(parents=True)
        for k in range(n):
            Image.new("RGB", (8, 8), (20 * k, 100, 7 * len(c))).save(root / c / f"{k}.png")
    return root


def test_an_empty_class_folder_is_an_error_not_an_extra_class(tmp_path, capsys) -> None:
    root = _folder(tmp_path / "pets", {"cat": 6, "dog": 6, "fish": 0})
    argv = ["run", f"data.source=imagefolder:{root}", *tiny(tmp_path), "--out", "run"]
    line = error_line(capsys, argv)
    assert "class folder(s) fish hold no images" in line
    assert "add images or remove it" in line
    (root / "fish").rmdir()  # the fix the line names: the run starts
    from osfl.data import load_data

    assert load_data(f"imagefolder:{root}").train.classes == ("cat", "dog")


def test_a_split_layout_class_without_training_images_is_an_error(tmp_path) -> None:
    from osfl.data import load_data
    from osfl.errors import DataError

    root = tmp_path / "d"
    _folder(root / "train", {"cat": 3, "dog": 3, "owl": 0})
    _folder(root / "test", {"cat": 2, "dog": 2, "owl": 2})
    with pytest.raises(DataError, match=r"class folder\(s\) train/owl hold no training images"):
        load_data(f"imagefolder:{root}")


@pytest.mark.parametrize(
    ("argv", "level"),
    [
        (["run", "-v"], logging.INFO),
        (["-v", "run"], logging.INFO),
        (["run", "-vv"], logging.DEBUG),
        (["-v", "run", "-v"], logging.DEBUG),
        (["run"], logging.WARNING),
    ],
)
def test_verbose_works_after_the_command_as_before_it(tmp_path, capsys, argv, level) -> None:
    out = tmp_path / "run"
    assert main([*argv, *tiny(tmp_path), "--out", str(out)]) == 0
    handlers = [h for h in logging.getLogger("osfl").handlers if h.level != logging.NOTSET]
    assert min(h.level for h in handlers) == level
    err = capsys.readouterr().err
    # piped: INFO lines are plain lines on stderr with -v, absent without
    assert ("INFO fedavg seed 0: accuracy" in err) == (level <= logging.INFO)
