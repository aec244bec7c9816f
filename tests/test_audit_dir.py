"""``osfl audit RUN_DIR`` (``osfl.audit_dir``): a recorded run re-scored by
another attack prints a table, exits 0 and merges the new results into
``metrics.json``, ``summary.md`` and ``audit.json`` beside the old ones; a
directory that is not a run, or holds no recorded observations, is a clear
exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from osfl.cli import main


@pytest.fixture
def recorded(audited_run: Path, tmp_path: Path) -> Path:
    """A copy of the root conftest's audited run: ``osfl audit`` writes into it."""
    return Path(shutil.copytree(audited_run, tmp_path / "r"))


def test_osfl_audit_prints_a_table_and_exits_0(recorded: Path, capsys) -> None:
    code = main(["audit", str(recorded), "--attack", "zlg+", "--aux-per-class", "4"])
    assert code == 0
    out = capsys.readouterr().out
    assert "privacy audit" in out and "zlg+" in out and "scaffold" in out
    doc = json.loads((recorded / "metrics.json").read_text())
    assert set(doc["records"][0]["audit"]) == {"llg+", "zlg+"}  # merged, not replaced
    summary = (recorded / "summary.md").read_text()
    assert summary.count("## Privacy audit") == 1 and "llg+" in summary and "zlg+" in summary
    assert json.loads((recorded / "audit.json").read_text())[0]["method"] == "scaffold"


def test_osfl_audit_on_a_non_run_directory_exits_2(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["audit", str(tmp_path), "--attack", "rlu"])
    assert e.value.code == 2
    assert "not an osfl run directory" in capsys.readouterr().err
    (tmp_path / "config.yaml").write_text("name: x\n")
    with pytest.raises(SystemExit) as e:
        main(["audit", str(tmp_path), "--attack", "rlu"])
    assert e.value.code == 2
    assert "no recorded observations" in capsys.readouterr().err
