"""The configs the README's tour names run without a training-health warning
(docs/run-directory.md, "warnings": they fire only when something is wrong)."""

from __future__ import annotations

import json
import re

import pytest

from osfl.cli import main
from support.paths import ROOT

#: README config -> the overrides that make it cheap without changing what its
#: clients' training looks like (the warnings come from local training).
CHEAP = {
    # the attacks only score what the server saw: three rounds of ten local steps
    "configs/rlu_audit_digits.yaml": ["audit=[]"],
    # seed 0's FedAvg showed both false alarms: small clients that had not fitted
    # their data after round 0's two epochs, and client drift in later rounds
    # (FedProx, the other method, trains the same clients with a small proximal term)
    "configs/baselines_digits.yaml": ["seeds=[0]", "methods=[fedavg]"],
}
#: README configs checked elsewhere, and where.
COVERED = {
    "configs/default.yaml": "the README's default run, tests/docs/test_docs.py (check_docs "
    "fails on a warning the README does not show)",
}


def readme_configs() -> set[str]:
    text = (ROOT / "README.md").read_text()
    return {c for c in re.findall(r"configs/[\w.-]+\.yaml", text)}


def test_every_config_the_readme_names_is_checked() -> None:
    assert readme_configs() == set(CHEAP) | set(COVERED)


@pytest.mark.parametrize("config", sorted(CHEAP))
def test_a_readme_config_runs_without_a_training_warning(tmp_path, config) -> None:
    out = tmp_path / "run"
    argv = ["run", str(ROOT / config), *CHEAP[config], "--no-progress", "--out", str(out)]
    assert main([*argv, f"cache_dir={tmp_path / 'cache'}"]) == 0
    records = json.loads((out / "metrics.json").read_text())["records"]
    assert records
    warned = {f"{r['method']} seed {r['seed']}": r.get("warnings") for r in records}
    assert not any(warned.values()), warned
