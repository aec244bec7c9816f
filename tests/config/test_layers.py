"""A config file layers on its ``base:`` (the packaged default when it names
none), several files compose in order, and ``osfl config show`` prints the
result without running (osfl.config.layers; issue "What a researcher
expects, round three", item 2)."""

from __future__ import annotations

import os
import re
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
        "#   the run's name, from the file's: name=\"u\"",  # as osfl run names it
        "#   command-line overrides: partition.alpha=0.5",
    ]
    shown = load_config(write(tmp_path / "shown.yaml", out))
    assert shown == load_config(user, ["name=u", "partition.alpha=0.5"])
    assert shown.train.optimizer == "sgdm" and shown.partition.alpha == 0.5


def test_config_show_refuses_a_bad_key_with_exit_2(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["config", "show", "train.nosuch=1"])
    assert e.value.code == 2
    assert "unknown config key 'train.nosuch'" in capsys.readouterr().err


# --------------------------------------------------------------------------- issue 51
def test_base_resolution_reads_each_file_once_however_often_it_is_named(tmp_path: Path) -> None:
    """The issue's diamond: each level names the next twice, 16 levels deep.
    Read per path, that is 2^16 reads (118 s at 12 levels); memoised, 17."""
    from osfl.config.layers import config_layers
    from osfl.config.loading import _packaged_default, _read_yaml

    for i in range(16):
        write(
            tmp_path / f"l{i}.yaml",
            f"base: [l{i + 1}.yaml, l{i + 1}.yaml]\ntrain: {{lr: {i + 1}}}\n",
        )
    write(tmp_path / "l16.yaml", "base: none\ntrain: {epochs: 3}\n")
    reads: list[Path] = []

    def counting(path: Path):
        reads.append(path.resolve())
        return _read_yaml(path)

    layers = config_layers([tmp_path / "l0.yaml"], counting, _packaged_default)
    assert len(reads) == len(set(reads)) == 17 and len(layers) == 17
    cfg = load_config(tmp_path / "l0.yaml")
    assert (cfg.train.epochs, cfg.train.lr) == (3, 1.0)  # the top file is layered last


def test_a_diamond_layers_the_common_base_once_where_it_is_first_reached(tmp_path: Path) -> None:
    write(tmp_path / "common.yaml", "base: none\ntrain: {lr: 0.1, epochs: 1}\n")
    write(tmp_path / "a.yaml", "base: common.yaml\ntrain: {lr: 0.2}\n")
    write(tmp_path / "b.yaml", "base: common.yaml\ntrain: {epochs: 5}\n")
    cfg = load_config(write(tmp_path / "top.yaml", "base: [a.yaml, b.yaml]\n"))
    # common, a, b, top: b's base does not undo a's learning rate
    assert (cfg.train.lr, cfg.train.epochs) == (0.2, 5)


def test_a_base_that_is_no_yaml_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    secret = write(tmp_path / "secret.txt", "train:\n  lr: 0.1\nmy_password: hunter2\n")
    child = write(tmp_path / "child.yaml", f"base: {secret}\n")
    for base in (str(secret), "/etc/passwd"):
        child.write_text(f"base: {base}\n")
        with pytest.raises(ConfigError) as e:
            load_config(child)
        assert "is not a YAML file" in str(e.value)
        assert "hunter2" not in str(e.value) and "root:" not in str(e.value)
        assert "my_password" not in str(e.value)


def test_a_file_that_is_no_config_is_quoted_short(tmp_path: Path) -> None:
    """``osfl run /etc/passwd``-like files read as one long key: the message
    quotes at most 60 characters of it."""
    path = write(tmp_path / "x.yaml", "root:x:0:0:" + "a" * 300 + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "a" * 80 not in str(e.value) and "\u2026" in str(e.value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (b"train: {lr: \xff}\n", "is not UTF-8 text (byte 12)"),
        (b"train: {lr: 1}\x00\n", "is not text (a NUL byte"),
        (("a: " + "[" * 40 + "]" * 40).encode(), "more than 32 levels deep"),
        (b"- 1\n- 2\n", "must hold a mapping"),
    ],
)
def test_a_config_that_is_not_one_is_one_line(tmp_path: Path, text: bytes, says: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(text)
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_config(path)
    child = write(tmp_path / "child.yaml", "base: c.yaml\n")
    with pytest.raises(ConfigError, match=re.escape(says)):  # as a base too
        load_config(child)


def test_special_files_and_deep_overrides_are_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.yaml")
    with pytest.raises(ConfigError, match=r"is a FIFO \(named pipe\), not a regular file"):
        load_config(tmp_path / "fifo.yaml")
    with pytest.raises(ConfigError, match="is a character device, not a regular file"):
        load_config("/dev/zero")
    with pytest.raises(ConfigError, match="is a directory, not a regular file"):
        load_config(tmp_path)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"")
    os.truncate(big, (1 << 20) + 1)
    with pytest.raises(
        ConfigError, match=r"is 1,048,577 bytes \(1\.0 MiB\), more than the 1,048,576 bytes"
    ):
        load_config(big)
    with pytest.raises(ConfigError, match=r"override train.lr nests .* more than 32 levels"):
        load_config(None, ["train.lr=" + "[" * 3000 + "]" * 3000])
