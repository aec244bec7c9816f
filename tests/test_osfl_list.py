"""What a new user reads of the registries: ``osfl list`` (short tables),
``osfl list --method NAME`` (summary, paper, every option described), and a
"did you mean" for every unknown name."""

from __future__ import annotations

import pytest

from osfl.cli import main
from osfl.errors import ConfigError
from osfl.registry import Registry, did_you_mean


def test_an_unknown_name_suggests_the_closest_ones() -> None:
    reg: Registry[int] = Registry("method")
    for n in ("fedavg", "fedprox", "ensemble"):
        reg.add(n, 0)
    with pytest.raises(
        ConfigError, match=r"unknown method 'fedav' \(did you mean 'fedavg'\?\); valid: "
    ):
        reg.get("fedav")
    with pytest.raises(ConfigError) as e:
        reg.get("zzz")
    assert "did you mean" not in str(e.value) and "valid: ensemble, fedavg, fedprox" in str(e.value)
    assert did_you_mean("lrr", ["lr", "momentum"], "train.") == " (did you mean 'train.lr'?)"


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
