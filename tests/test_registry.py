"""Registries (``osfl.registry``): a name registered twice is refused, an
unknown one lists the valid names and suggests the closest, and the generic
plugin hook imports a group's entry points once, on the first read after
``accept_plugins``, recording where each came from. Methods from another
package through that hook: ``tests/methods/test_plugins.py``."""

from __future__ import annotations

import sys

import pytest

from osfl.errors import ConfigError
from osfl.registry import Registry, did_you_mean
from support.plugins import install_metadata, write_module


def test_registry_refuses_duplicates_and_lists_valid_names() -> None:
    reg: Registry[int] = Registry("thing")
    reg.add("Alpha", 1)
    assert reg.get("alpha") == 1 and "ALPHA" in reg and reg.names() == ["alpha"]
    with pytest.raises(ValueError, match="duplicate"):
        reg.add("alpha", 2)
    with pytest.raises(ConfigError, match="valid: alpha"):
        reg.get("beta")


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


def test_plugins_load_once_on_the_first_read_and_only_after_accept(tmp_path, monkeypatch) -> None:
    """The generic hook: nothing is imported before ``accept_plugins`` or
    before the first read, and the group's entry points are imported once."""
    site = tmp_path / "site"
    monkeypatch.syspath_prepend(str(site))
    site.mkdir()
    write_module(site, "counted", "import builtins\nbuiltins.osfl_loads += 1\nThing = object()\n")
    info = install_metadata(site, "counted-pkg", {})
    (info / "entry_points.txt").write_text("[osfl.things]\nthing = counted:Thing\n")
    monkeypatch.setattr("builtins.osfl_loads", 0, raising=False)
    import builtins

    reg: Registry[object] = Registry("thing")
    reg.add("builtin", 1)
    assert reg.names() == ["builtin"]  # not accepted: no plugin
    reg.accept_plugins("osfl.things", lambda name, obj: obj)
    assert builtins.osfl_loads == 0  # accepting imports nothing
    assert reg.names() == ["builtin", "thing"] and "thing" in reg and len(reg) == 2
    assert reg.get("thing") is sys.modules["counted"].Thing
    assert builtins.osfl_loads == 1
    assert reg.origin("builtin") is None
    assert reg.origin("thing") == (
        "entry point 'thing = counted:Thing' (group osfl.things) of counted-pkg 0.1.0"
    )
