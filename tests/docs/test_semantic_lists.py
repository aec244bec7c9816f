"""The semantic mutation lists (``tests/mutation_semantic/*.yaml``) still
describe the code: every bug's snippet occurs once in its file, and the file
with the bug written in still parses. A refactor that moves a line silently
turns a bug into "snippet not found" (the next mutation run errors), and a
bug whose indentation no longer matches its file is "caught" by every test
through a SyntaxError, proving nothing; this check runs in the fast suite so
both surface at the refactor, not at the next mutation run."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
semantic = load_script("scripts/semantic_mutation.py")


def test_every_bug_applies_once_and_parses() -> None:
    assert semantic.main(["--check"]) == 0


def test_a_bug_that_breaks_the_syntax_is_refused(tmp_path: Path) -> None:
    bug = next(b for b in semantic.load_bugs() if b.method == "fedavg")
    target = tmp_path / bug.file
    target.parent.mkdir(parents=True)
    target.write_text((ROOT / bug.file).read_text())
    broken = semantic.Bug(**{**vars(bug), "replace": "    " + bug.replace})
    with pytest.raises(ValueError, match="unparsable"):
        semantic.apply(broken, tmp_path)
