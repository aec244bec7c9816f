"""A config file layers on its ``base:`` (the packaged default when it names
none), several files compose in order, and ``osfl config show`` prints the
result without running (osfl.config.layers; issue "What a researcher
expects, round three", item 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from osfl.cli import main
from osfl.config import load_config, load_config_text, to_yaml
from osfl.errors import ConfigError
from support.paths import ROOT


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_file_naming_no_base_keeps_the_packaged_default(tmp_path: Path) -> None:
    """The issue's case: a file holding only ``train: {epochs: 1}`` runs the
    default's sgdm / lr 0.05 / batch 32 / alpha 0.1, one epoch."""
    cfg = load_config(write(tmp_path / "u.yaml", "train: {epochs: 1}\n"))
    default = load_config(None)
    assert cfg.train.epochs == 1
    assert (cfg.train.optimizer, cfg.train.lr, cfg.train.batch_size) == ("sgdm", 0.05, 32)
    assert cfg.partition.alpha == default.partition.alpha == 0.1
    assert cfg.method == default.method  # the default's method options come along too


def test_base_none_stands_on_the_dataclass_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path / "u.yaml", "base: none\ntrain: {epochs: 1}\n"))
    bare = load_config(None, embedded_default=False)
    assert cfg.train.optimizer == bare.train.optimizer != "sgdm"
    assert cfg.train.lr == bare.train.lr


def test_a_base_file_is_relative_to_the_file_naming_it(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    write(tmp_path / "common.yaml", "base: none\ntrain: {lr: 0.2, epochs: 3}\n")
    child = write(tmp_path / "sub" / "run.yaml", "base: ../common.yaml\ntrain: {epochs: 7}\n")
    cfg = load_config(child)
    assert (cfg.train.lr, cfg.train.epochs) == (0.2, 7)


def test_files_compose_in_order_and_overrides_win(tmp_path: Path) -> None:
    """A later file without ``base:`` adds to what came before: it does not
    bring the default back over the first file's values."""
    a = write(tmp_path / "a.yaml", "train: {lr: 0.3, epochs: 2}\n")
    b = write(tmp_path / "b.yaml", "train: {epochs: 4}\n")
    cfg = load_config([a, b], ["train.batch_size=8"])
    assert (cfg.train.lr, cfg.train.epochs, cfg.train.batch_size) == (0.3, 4, 8)
    assert load_config([b, a]).train.epochs == 2


def test_a_cycle_of_bases_and_a_bad_base_are_one_line_errors(tmp_path: Path) -> None:
    write(tmp_path / "x.yaml", "base: y.yaml\n")
    write(tmp_path / "y.yaml", "base: x.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "x.yaml")
    with pytest.raises(ConfigError, match="base must be"):
        load_config(write(tmp_path / "z.yaml", "base: 3\n"))
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(write(tmp_path / "w.yaml", "base: missing.yaml\n"))


def test_every_repository_config_is_complete_on_its_own() -> None:
    """Each experiment config of configs/ says ``base: none``: its numbers
    were made on the dataclass defaults, and layering it on default.yaml
    would change them."""
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        text = path.read_text()
        if "\nname:" not in text or path.name.startswith(("pretrain_", "rlu_")):
            continue  # not an experiment config (pretraining, RLU's own tables)
        assert "\nbase: none" in text, path.name


def test_the_resolved_config_reads_back_to_itself(tmp_path: Path) -> None:
    """A run directory's config.yaml (``to_yaml``) holds every key and says
    ``base: none``, so reading it back, as file or as Flower's YAML text,
    gives the same config."""
    cfg = load_config(write(tmp_path / "u.yaml", "train: {epochs: 1}\n"))
    text = to_yaml(cfg)
    assert text.startswith("base: none\n")
    assert load_config(write(tmp_path / "resolved.yaml", text)) == cfg
    assert load_config_text(text) == cfg
    assert load_config_text("train: {epochs: 1}\n").train.optimizer != "sgdm"  # old texts: none
    assert load_config_text("base: default\ntrain: {epochs: 1}\n") == cfg


def test_config_show_prints_the_layers_and_a_runnable_config(tmp_path: Path, capsys) -> None:
    user = write(tmp_path / "u.yaml", "train: {epochs: 1}\n")
    assert main(["config", "show", str(user), "partition.alpha=0.5"]) == 0
    out = capsys.readouterr().out
    layers = [line for line in out.splitlines() if line.startswith("#   ")]
    assert layers == [
        "#   dataclass defaults (osfl/config/schema.py)",
        "#   embedded default.yaml",
        f"#   {user}",
        "#   command-line overrides: partition.alpha=0.5",
    ]
    shown = load_config(write(tmp_path / "shown.yaml", out))
    assert shown == load_config(user, ["partition.alpha=0.5"])
    assert shown.train.optimizer == "sgdm" and shown.partition.alpha == 0.5


def test_config_show_refuses_a_bad_key_with_exit_2(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["config", "show", "train.nosuch=1"])
    assert e.value.code == 2
    assert "unknown config key 'train.nosuch'" in capsys.readouterr().err
