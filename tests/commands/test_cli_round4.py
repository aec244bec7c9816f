"""Round four's frictions of a first run (issue 52): a string where a list
belongs, a run named after its config file, a sweep's piped lines, the
footer's time, and Flower's colour codes in piped output."""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

import pytest

from osfl.cli import main
from osfl.commands.common import name_from_file, process_seconds
from support.cli import error_line
from support.smoke import tiny_cli_args

#: When this module was imported: the process started before it.
IMPORTED = time.perf_counter()


# --------------------------------------------------------------------------- logger=NAME
def test_a_single_logger_name_says_to_write_a_list(capsys, tmp_path) -> None:
    line = error_line(capsys, ["run", "logger=tensorboard"])
    assert "AnyNode" not in line and "ListConfig" not in line
    assert "logger is a list: write logger=[tensorboard]" in line
    config = tmp_path / "c.yaml"
    config.write_text("logger: tensorboard\n")
    line = error_line(capsys, ["run", str(config)])
    assert "(in YAML: logger: [tensorboard])" in line and str(config) in line


# --------------------------------------------------------------------------- the run's name
def test_a_config_file_that_names_no_run_names_it_after_itself(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("my_exp.yaml").write_text("methods: [fedavg]\n")
    Path("named.yaml").write_text("name: chosen\nmethods: [fedavg]\n")
    Path("child.yaml").write_text("base: named.yaml\ntrain: {epochs: 1}\n")
    Path("1e5.yaml").write_text("methods: [fedavg]\n")
    assert name_from_file(["my_exp.yaml"], []) == ['name="my_exp"']
    assert name_from_file(["my_exp.yaml", "1e5.yaml"], []) == ['name="1e5"']  # the last file
    assert name_from_file(["named.yaml", "my_exp.yaml"], []) == []  # one of them names it
    assert name_from_file(["named.yaml"], []) == []  # its own name stays
    assert name_from_file(["child.yaml"], []) == []  # its base's name stays
    assert name_from_file(["my_exp.yaml"], ["name=mine"]) == []  # the command line's stays
    assert name_from_file([], []) == []  # the packaged default: "default"
    assert name_from_file(["1e5.yaml"], []) == ['name="1e5"']  # a string, not 100000.0


def test_osfl_config_show_and_run_use_the_files_name(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    Path("my_exp.yaml").write_text("methods: [fedavg]\n")
    assert main(["config", "show", "my_exp.yaml"]) == 0
    out = capsys.readouterr().out
    assert "\nname: my_exp\n" in out
    assert "#   the run's name, from the file's: name=\"my_exp\"" in out
    args = [a for a in tiny_cli_args(tmp_path, "fedavg") if not a.startswith("methods=")]
    assert main(["run", "my_exp.yaml", *args]) == 0
    (run,) = Path("runs").iterdir()
    assert run.name.endswith("-my_exp"), run.name
    assert "my_exp — digits" in capsys.readouterr().out


# --------------------------------------------------------------------------- a piped sweep, the footer
def test_a_piped_sweep_says_what_each_line_is_and_the_footer_counts_start_up(
    tmp_path, capsys
) -> None:
    out = tmp_path / "sweep"
    argv = ["run", *tiny_cli_args(tmp_path, "fedavg"), "--sweep", "partition.alpha=0.5,1.0"]
    assert main([*argv, "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "grid point 1 of 2: partition.alpha=0.5" in lines
    assert "grid point 2 of 2: partition.alpha=1.0" in lines
    assert not [line for line in lines if line.strip() == "partition.alpha=0.5"]  # no bare line
    footer = next(line for line in lines if line.startswith("run directory: "))
    shown = float(re.search(r"\((\d+\.\d) s\)$", footer).group(1))
    run_only = json.loads((out / "metrics.json").read_text())["wall_time_s"]
    # the process started (pytest, imports, data, plans) before the methods ran
    assert shown > run_only + 0.05, (shown, run_only)


def test_process_seconds_count_from_the_process_start() -> None:
    assert process_seconds() >= time.perf_counter() - IMPORTED - 0.02  # one clock tick


# --------------------------------------------------------------------------- Flower's colours
def test_flowers_log_lines_have_no_colour_codes_when_piped(monkeypatch) -> None:
    pytest.importorskip("flwr")
    from flwr.common.logger import console_handler

    from osfl.flower.grid import plain_flower_logs_when_piped

    record = logging.LogRecord("flwr", logging.INFO, __file__, 1, "aggregate_fit", (), None)
    monkeypatch.setattr(console_handler, "colored", True)
    monkeypatch.delenv("NO_COLOR", raising=False)

    class Terminal:
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stderr", Terminal())
    plain_flower_logs_when_piped()
    assert "\x1b[" in console_handler.format(record)  # a terminal keeps Flower's colours
    monkeypatch.setenv("NO_COLOR", "1")
    plain_flower_logs_when_piped()
    assert "\x1b[" not in console_handler.format(record)
    monkeypatch.setattr(console_handler, "colored", True)
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setattr("sys.stderr", None)  # piped, replaced or closed
    plain_flower_logs_when_piped()
    assert console_handler.format(record) == "INFO :      aggregate_fit"
