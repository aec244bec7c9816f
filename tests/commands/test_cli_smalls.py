"""The small things a new user trips over (issue 44, item 6), each one line
that says what happened: a sweep split by the shell at a space, a YAML
syntax error with its line and column (a resume that differs only in
``--no-progress``: ``tests/test_runner.py``; the live display that names the
seed it runs: ``tests/test_experiment.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from osfl.config import load_config
from osfl.errors import ConfigError
from support.smoke import exit_2


def test_a_sweep_split_at_a_space_says_so_with_the_command_that_works(capsys) -> None:
    line = exit_2(capsys, ["run", "--sweep", "partition.alpha=0.1,", "1.0"])
    assert "config file not found" not in line
    assert "split its values at a space" in line and "'1.0' was taken for a config file" in line
    assert "--sweep partition.alpha=0.1,1.0" in line
    line = exit_2(capsys, ["run", "--sweep", "methods=fedavg,", "local"])
    assert "--sweep methods=fedavg,local" in line


def test_a_yaml_syntax_error_keeps_its_line_and_column(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  epochs: 1\n  lr: [0.1\nmethods: [fedavg]\n")
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    text = str(info.value)
    assert "line 4, column 8" in text and "did not find expected ',' or ']'" in text
    assert "flow sequence at line 3, column 7" in text and "\n" not in text
    line = exit_2(capsys, ["run", str(bad)])
    assert line.startswith(f"osfl: error: cannot parse {bad}, line 4, column 8: ")


def test_check_docs_k_that_matches_no_block_fails_and_its_own_example_matches(capsys) -> None:
    """``-k`` with a mistyped keyword ran nothing and exited 0, the docstring's
    own example (``-k default``) among them."""
    import re

    from support.scripts import ROOT, load_script

    check_docs = load_script("scripts/check_docs.py")
    assert check_docs.main([str(ROOT / "README.md"), "-k", "no-such-command-xyz"]) == 2
    assert "no doccheck block's command contains 'no-such-command-xyz'" in capsys.readouterr().err
    example = re.search(r"check_docs\.py (\S+) -k (\S+)", check_docs.__doc__)
    assert example is not None
    path, keyword = ROOT / example.group(1), example.group(2)
    assert any(keyword in b.command for b in check_docs.blocks(path)), keyword
