"""Methods from the user's own package (docs/adding-a-method.md): the
``osfl.methods`` entry points join the registry on its first read, and every
way a plugin can be wrong is one line naming its entry point.

The example package is ``tests/fixtures/osfl_vote`` (majority vote). The fast
tests make its ``.dist-info`` by hand (what ``pip install`` writes and
``importlib.metadata`` reads) and run it in process; the slow one installs it
with pip into a folder of its own and runs it from the command line, with its
own tests and osfl's registry-wide contract test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import osfl.methods  # noqa: F401  (registers the methods, arms the plugins)
from osfl.cli import main
from osfl.fl.method import METHODS
from osfl.methods.plugins import METHOD_PLUGINS, adopt_method
from osfl.registry import NO_PLUGINS_ENV, PluginError
from support.cli import error_line
from support.paths import FIXTURES, ROOT
from support.plugins import install_metadata, write_module
from support.smoke import tiny_cli_args

EXAMPLE = FIXTURES / "osfl_vote"


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path for plugins, and METHODS as it is at start-up
    (its built-ins, plugins not yet loaded); both restored afterwards."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv(NO_PLUGINS_ENV, raising=False)
    builtins = {n: METHODS.get(n) for n in METHODS.names() if METHODS.origin(n) is None}
    for attr, fresh in (("_items", builtins), ("_origins", {}), ("_plugin_error", None)):
        monkeypatch.setattr(METHODS, attr, fresh)
    monkeypatch.setattr(METHODS, "_group", None)
    METHODS.accept_plugins(METHOD_PLUGINS, adopt_method)
    yield site


# --------------------------------------------------------------------------- the example package
def test_the_example_plugin_is_listed_and_runs_from_the_cli(plugins, tmp_path, capsys) -> None:
    plugins_src = plugins / "osfl_vote"
    shutil.copytree(EXAMPLE / "src" / "osfl_vote", plugins_src)
    for mod in [m for m in sys.modules if m.startswith("osfl_vote")]:
        del sys.modules[mod]
    install_metadata(plugins, "osfl-vote", {"vote": "osfl_vote:MajorityVote"})

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert any(line.startswith("│ vote ") for line in out.splitlines()), out
    assert "plugin vote: entry point 'vote = osfl_vote:MajorityVote' (group osfl.methods)" in out
    assert "of osfl-vote 0.1.0" in out

    assert main(["list", "--method", "vote"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("vote: Keeps every client's model and predicts the class most")
    assert "from: entry point 'vote = osfl_vote:MajorityVote'" in out and "│ weighting " in out

    run = tmp_path / "run"
    args = tiny_cli_args(tmp_path, "vote,ensemble")
    assert main(["run", *args, "--out", str(run)]) == 0
    vote, ensemble = json.loads((run / "metrics.json").read_text())["records"]
    assert (vote["method"], ensemble["method"]) == ("vote", "ensemble")
    assert vote["bytes_up"] == ensemble["bytes_up"]  # the same client models, voted
    assert (run / "models" / "vote-seed0" / "model.safetensors").is_file()
    capsys.readouterr()
    assert main(["table", str(run)]) == 0
    assert any(line.startswith("│ vote ") for line in capsys.readouterr().out.splitlines())


def test_every_python_block_of_the_how_to_is_the_example_packages_code() -> None:
    """docs/adding-a-method.md quotes the tested package, never a copy that drifts."""
    page = (ROOT / "docs" / "adding-a-method.md").read_text()
    code = "\n".join(f.read_text() for f in sorted(EXAMPLE.rglob("*.py")))
    blocks = re.findall(r"^```python\n(.*?)^```$", page, flags=re.S | re.M)
    assert len(blocks) >= 5, "the how-to shows the predictor, options, class and tests"
    stray = [b.splitlines()[0] for b in blocks if b not in code]
    assert not stray, f"docs/adding-a-method.md blocks not in tests/fixtures/osfl_vote: {stray}"
    toml = (EXAMPLE / "pyproject.toml").read_text()
    assert '[project.entry-points."osfl.methods"]\nvote = "osfl_vote:MajorityVote"' in toml
    assert '[project.entry-points."osfl.methods"]\nvote = "osfl_vote:MajorityVote"' in page


# --------------------------------------------------------------------------- refusals
def test_a_plugin_that_fails_to_import_is_one_line_naming_it(plugins, capsys) -> None:
    write_module(plugins, "broken_plugin", "import no_such_module_xyz\n")
    install_metadata(plugins, "broken-pkg", {"mine": "broken_plugin:Mine"})
    line = error_line(capsys, ["list"])
    assert "plugin entry point 'mine = broken_plugin:Mine' (group osfl.methods)" in line
    assert "of broken-pkg 0.1.0 failed to load: ModuleNotFoundError" in line
    assert "no_such_module_xyz" in line and f"{NO_PLUGINS_ENV}=1" in line
    # every later read says the same, not a registry without it
    assert "failed to load" in error_line(capsys, ["run", "methods=[fedavg]"])


def test_a_plugin_taking_a_builtin_name_is_refused_before_its_code_runs(plugins, capsys) -> None:
    write_module(plugins, "clash_plugin", "raise SystemExit('imported')\n")
    install_metadata(plugins, "clash-pkg", {"FedAvg": "clash_plugin:Mine"})
    line = error_line(capsys, ["list"])
    assert "plugin entry point 'FedAvg = clash_plugin:Mine'" in line
    assert "takes the name 'fedavg' of a built-in method: rename its entry point" in line
    assert "clash_plugin" not in sys.modules


def test_two_plugins_of_one_name_are_refused_naming_both(plugins, capsys) -> None:
    good = "from osfl.methods.ensemble import Ensemble\nclass Mine(Ensemble):\n    pass\n"
    write_module(plugins, "first_plugin", good)
    write_module(plugins, "second_plugin", good)
    install_metadata(plugins, "first-pkg", {"mine": "first_plugin:Mine"})
    install_metadata(plugins, "second-pkg", {"mine": "second_plugin:Mine"})
    line = error_line(capsys, ["list"])
    assert (
        "plugin entry point 'mine = second_plugin:Mine' (group osfl.methods) of second-pkg" in line
    )
    assert "takes the name 'mine' of the method of entry point 'mine = first_plugin:Mine'" in line


def test_a_plugin_registering_a_builtin_name_on_import_is_refused(plugins, capsys) -> None:
    source = (
        "from osfl.fl.method import register_method\n"
        "from osfl.methods.ensemble import Ensemble\n"
        "@register_method('ensemble')\n"
        "class Mine(Ensemble):\n"
        "    pass\n"
    )
    write_module(plugins, "sneaky_plugin", source)
    install_metadata(plugins, "sneaky-pkg", {"mine": "sneaky_plugin"})
    line = error_line(capsys, ["list"])
    assert "'mine = sneaky_plugin'" in line and "duplicate method name 'ensemble'" in line


@pytest.mark.parametrize(
    ("source", "target", "needle"),
    [
        ("Mine = 3\n", "m:Mine", "3 is not a subclass of osfl.fl.method.Method"),
        (
            "from osfl.fl.method import Method\nclass Mine(Method):\n    pass\n",
            "m:Mine",
            "Mine does not implement aggregate, broadcast, client_update, init_state, "
            "predictor, upload_spec",
        ),
        (
            "from osfl.methods.ensemble import Ensemble\nclass Mine(Ensemble):\n    Config = dict\n",
            "m:Mine",
            "Mine.Config must be a dataclass of its options",
        ),
        (
            "import dataclasses\nfrom osfl.methods.ensemble import Ensemble\n"
            "class Mine(Ensemble):\n"
            "    card = dataclasses.replace(Ensemble.card, regime='vibes')\n",
            "m:Mine",
            "its card's regime 'vibes' is not one of scratch, pretrained",
        ),
        (
            "from osfl.fl.method import MethodCard\nfrom osfl.methods.ensemble import Ensemble\n"
            "class Mine(Ensemble):\n    card = MethodCard()\n",
            "m:Mine",
            "its card has no one-line summary",
        ),
        ("x = 1\n", "m", "it registers no method named 'mine'"),
    ],
)
def test_what_is_not_a_method_is_refused_in_one_line(
    plugins, capsys, source: str, target: str, needle: str
) -> None:
    write_module(plugins, "m", source)
    install_metadata(plugins, "bad-pkg", {"mine": target})
    line = error_line(capsys, ["list"])
    assert f"plugin entry point 'mine = {target}'" in line and "is refused" in line
    assert needle in line


def test_a_class_registered_under_another_name_is_refused(plugins) -> None:
    write_module(
        plugins,
        "renamed",
        "from osfl.methods.ensemble import Ensemble\nclass Mine(Ensemble):\n    name = 'other'\n",
    )
    install_metadata(plugins, "renamed-pkg", {"mine": "renamed:Mine"})
    with pytest.raises(PluginError, match="Mine registers itself as 'other', not 'mine'"):
        METHODS.names()


def test_no_plugins_env_leaves_every_plugin_out(plugins, monkeypatch) -> None:
    write_module(plugins, "broken_plugin2", "import no_such_module_xyz\n")
    install_metadata(plugins, "broken-pkg2", {"mine": "broken_plugin2:Mine"})
    monkeypatch.setenv(NO_PLUGINS_ENV, "1")
    assert "mine" not in METHODS and "fedavg" in METHODS


# --------------------------------------------------------------------------- installed with pip
@pytest.mark.slow
def test_the_example_package_installed_with_pip_runs_with_its_tests(tmp_path: Path) -> None:
    """``pip install`` of tests/fixtures/osfl_vote (into a folder of its own,
    no network), then, as a user would: ``osfl list``, a tiny ``osfl run`` of
    the vote beside the ensemble, ``osfl table`` on it, the package's own
    tests, and osfl's registry-wide contract test on the plugin."""
    source, site = tmp_path / "osfl_vote", tmp_path / "site"
    shutil.copytree(EXAMPLE, source)  # pip builds in place: keep the fixture clean
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip, "--no-index", "-q", "--target", str(site), str(source)], check=True, timeout=300
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop(NO_PLUGINS_ENV, None)

    def osfl(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "osfl", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "plugin vote: entry point 'vote = osfl_vote:MajorityVote'" in osfl("list")
    osfl("run", *tiny_cli_args(tmp_path, "vote,ensemble"), "--out", str(tmp_path / "run"))
    assert "│ vote " in osfl("table", str(tmp_path / "run"))

    for tests in (
        [str(source / "tests")],
        [str(ROOT / "tests" / "fl" / "test_contract.py"), "-k", "vote"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            cwd=source if tests[0].startswith(str(source)) else ROOT,
        )
        assert done.returncode == 0, done.stdout[-3000:]
        assert " passed" in done.stdout and " failed" not in done.stdout
