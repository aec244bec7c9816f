"""What a new user reads of the registries: ``osfl list`` (short tables),
``osfl list --method NAME`` (summary, paper, every option described), and a
"did you mean" for every unknown name."""

from __future__ import annotations

import pytest

from osfl.cli import main


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["list", "--method", "fedav"], "unknown method 'fedav' (did you mean 'fedavg'"),
        (["run", "model.name=resnet-18"], "unknown model 'resnet-18' (did you mean 'resnet18'"),
        (["run", "train.lrr=0.1"], "unknown config key 'train.lrr' (did you mean 'train.lr'?)"),
        (["run", "method.fedavg.round=2"], "unknown option 'round' (did you mean 'rounds'?)"),
    ],
)
def test_every_kind_of_name_gets_a_did_you_mean(capsys, argv, needle) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


def _methods():
    """osfl's own methods (a method another installed package adds states
    its card for itself: docs/adding-a-method.md)."""
    import osfl.methods  # noqa: F401  (registers the methods)
    from osfl.fl.method import METHODS

    return [METHODS.get(n) for n in METHODS.names() if METHODS.origin(n) is None]


#: Methods that follow no paper (a baseline osfl defines).
NO_PAPER = {"local"}


def test_every_method_has_its_own_one_line_summary_and_paper() -> None:
    summaries = {}
    for cls in _methods():
        s = cls.card.summary
        assert s and "\n" not in s and len(s) <= 120, (
            f"method {cls.name!r} needs a card.summary of one line, at most 120 characters "
            f"(what osfl list shows), not {s!r}"
        )
        summaries.setdefault(s, []).append(cls.name)
        if cls.name in NO_PAPER:
            assert not cls.card.paper, f"method {cls.name!r} is in NO_PAPER but names a paper"
        else:
            assert cls.card.paper, (
                f"method {cls.name!r} has no card.paper (the work it follows: authors, venue, "
                "year); an osfl baseline of its own goes into NO_PAPER here"
            )
    # a card made from its parent's must not say the parent's words
    shared = {s: names for s, names in summaries.items() if len(names) > 1}
    assert not shared, f"methods share one card.summary (a card copied from its parent): {shared}"


def test_every_option_of_every_method_has_a_description() -> None:
    from osfl.config import config_options

    missing = [
        f"method {cls.name!r} option {o.key!r}"
        for cls in _methods()
        for o in config_options(cls.Config)
        if not o.help or "\n" in o.help
    ]
    assert missing == [], (
        f"{', '.join(missing)}: no one-line '#:' comment above the field in its Config "
        "(what osfl list --method shows)"
    )


def test_osfl_list_is_short_tables(capsys) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    row = next(line for line in lines if line.startswith("│ fedavg "))
    assert "one-shot" in row and "weights" in row and "Averages the clients' trained weights" in row
    assert any(line.startswith("│ fedprox ") and "│ 10 " in line for line in lines)
    assert any(line.startswith("│ models ") and "model.name" in line for line in lines)
    assert max(map(len, lines)) < 400  # piped: one line per row, no 2,000-character line


def test_osfl_list_method_describes_it_for_users(capsys) -> None:
    assert main(["list", "--method", "dense"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dense: The server trains a generator")
    assert 'paper: Zhang et al., "DENSE: Data-Free One-Shot Federated Learning"' in out
    row = next(line for line in out.splitlines() if line.startswith("│ distill.lr "))
    assert "│ 0.005 " in row  # DENSE's own default, not DistillConfig's
    assert main(["list", "--method", "local"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("local: Each client keeps its own model") and "options: none" in out
