"""``python -m osfl.flower_app DIR``: a method or experiment that cannot run is
refused when the app directory is written, in one line with exit status 2,
not later when the SuperLink first runs the app (issue "Hostile peers and
damaged files, round three"); a directory it writes is one Flower itself
validates, with osfl's apps as its components."""

from __future__ import annotations

from pathlib import Path

import pytest

from osfl.flower.spec import JobSpec
from osfl.flower_app.app_dir import main


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--method", "nosuch"], "--method: unknown method 'nosuch'"),
        (["--method", "fedav"], "did you mean 'fedavg'"),
        (
            ["--experiment", "/no/such/config.yaml"],
            "--experiment /no/such/config.yaml: no such file",
        ),
    ],
)
def test_a_bad_method_or_experiment_is_refused(tmp_path: Path, capsys, argv, said) -> None:
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "app"), *argv])
    assert e.value.code == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "app").exists()  # nothing written


def test_a_known_method_writes_the_app(tmp_path: Path) -> None:
    assert main([str(tmp_path / "app"), "--method", "fedavg"]) == 0
    assert 'method = "fedavg"' in (tmp_path / "app" / "pyproject.toml").read_text()


# --------------------------------------------------------------------------- the app directory
def test_written_app_is_a_valid_flower_app(tmp_path: Path) -> None:
    from flwr.cli.config_utils import load_and_validate

    assert main([str(tmp_path / "app"), "--method", "ensemble", "--seed", "2"]) == 0
    config, _ = load_and_validate(tmp_path / "app" / "pyproject.toml", check_module=True)
    run_config = config["tool"]["flwr"]["app"]["config"]
    assert JobSpec.from_run_config(run_config) == JobSpec(method="ensemble", seed=2)
    comps = config["tool"]["flwr"]["app"]["components"]
    assert comps == {
        "serverapp": "osfl.flower_app.apps:server_app",
        "clientapp": "osfl.flower_app.apps:client_app",
    }
