"""How the scoreboard names the variants of one method (mutation survivors:
TESTING.md): options flattened to dotted keys, non-strings as key-sorted
JSON, a missing option shown as an em dash."""

from __future__ import annotations

from osfl.scoreboard import _flat, variant_labels


def test_options_flatten_to_dotted_keys_with_sorted_json_values() -> None:
    tree = {"a": {"b": 1, "c": "x"}, "d": {"z": 1, "y": [2, 3]}, "e": True}
    assert _flat({"a": tree["a"], "e": True}) == {"a.b": "1", "a.c": "x", "e": "true"}
    assert _flat({"m": {"opt": {"z": 1, "y": 2}}}, prefix="p.") == {
        "p.m.opt.z": "1",
        "p.m.opt.y": "2",
    }
    assert _flat({"o": [{"z": 1, "y": 2}]}) == {"o": '[{"y": 2, "z": 1}]'}


def test_variant_labels_name_only_what_differs_and_mark_absent_options() -> None:
    configs = [{"lr": 0.1, "k": "a"}, {"lr": 0.2, "k": "a"}, {"k": "a", "extra": {"n": 3}}]
    assert variant_labels(configs) == [
        "extra.n=—, lr=0.1",
        "extra.n=—, lr=0.2",
        "extra.n=3, lr=—",
    ]
    assert variant_labels([{"k": 1}, {"k": 1}]) == ["", ""]
