"""What the ``osfl`` command prints: logging goes through the live display's
console in a terminal; piped output has no colour codes and no wrapped tables."""

from __future__ import annotations

import io
import logging

import pytest
from rich.console import Console
from rich.table import Table

from osfl import cli
from osfl.commands import common
from osfl.fl.progress import RichProgress

LONG = "client 3: local training: " + " ".join(f"word{i}" for i in range(40))


@pytest.fixture
def osfl_logger():
    logger = logging.getLogger("osfl")
    handlers, level = list(logger.handlers), logger.level
    yield logger
    for h in list(logger.handlers):
        if h not in handlers:
            logger.removeHandler(h)
    logger.setLevel(level)


def test_in_a_terminal_logs_go_through_the_progress_display_whole(osfl_logger) -> None:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=60, color_system=None)
    common.setup_logging(0, console)
    (handler,) = [h for h in osfl_logger.handlers if getattr(h, "console", None) is not None]
    assert handler.console is console  # the console the live display draws on
    with RichProgress(console) as board, board.task("client 3: local training", total=10) as bar:
        bar.advance(5)
        logging.getLogger("osfl.fl.training").warning(LONG)
    text = screen.getvalue()
    words = " ".join(text.split())  # the message may wrap, but not lose a word
    assert all(f"word{i}" in words for i in range(40))
    # the log line is printed above the bar, not appended to one of its lines
    assert not any("eta" in line and "word" in line for line in text.splitlines())


def test_piped_logs_are_plain_lines_on_stderr(osfl_logger, capsys) -> None:
    console = Console(file=io.StringIO())  # not a terminal
    common.setup_logging(0, console)
    logging.getLogger("osfl.fl.training").warning(LONG)
    err = capsys.readouterr().err
    assert err == f"WARNING {LONG}\n"


def test_piped_output_has_no_colour_and_no_wrapped_table(capsys) -> None:
    console = common.make_console()  # pytest captures stdout: not a terminal
    assert not console.is_terminal and console.width == common.PIPED_WIDTH
    table = Table(title="privacy audit")
    for name in ("method", "attack", "threat model", "notes"):
        table.add_column(name)
    table.add_row("fedavg", "rlu", "honest-but-curious server", "x" * 120)
    console.print(table)
    console.print("[yellow]warning[/yellow] " + "y" * 300)
    out = capsys.readouterr().out
    assert "\x1b[" not in out
    assert "honest-but-curious server" in out and "x" * 120 in out
    assert ("warning " + "y" * 300) in out.splitlines()


def test_every_command_prints_through_one_console(capsys) -> None:
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "\x1b[" not in out and "methods" in out


def test_flower_lines_lose_their_colour_codes_on_the_way_to_a_file() -> None:
    from osfl.flower_app.local import plain

    assert plain("\x1b[92mINFO \x1b[0m:      Starting Flower ServerApp\n") == (
        "INFO :      Starting Flower ServerApp\n"
    )
