"""JSON in and out of osfl (``osfl.jsonio``): out, a non-finite float is
``null`` and numpy and torch values plain Python, so one NaN never loses a
record; in, the size and nesting depth are bounded before parsing, so a
deeply nested message is a ``ValueError`` and not a ``RecursionError``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from osfl import jsonio


def test_non_finite_floats_are_null_and_arrays_plain() -> None:
    record = {
        "loss": math.nan,
        "grad": [math.inf, -math.inf, 0.5],
        "acc": np.float32(0.25),
        "counts": np.array([1, 2]),
        "w": torch.tensor([1.5, math.nan]),
        3: {"nested": (1, {"x": math.nan})},
        "path": jsonio,  # anything else: its str
    }
    text = jsonio.dumps(record, sort_keys=True)
    back = json.loads(text)
    assert back["loss"] is None and back["grad"] == [None, None, 0.5]
    assert back["acc"] == 0.25 and back["counts"] == [1, 2] and back["w"] == [1.5, None]
    assert back["3"] == {"nested": [1, {"x": None}]}
    assert back["path"] == str(jsonio)
    with pytest.raises(ValueError):
        json.dumps({"loss": math.nan}, allow_nan=False)  # what dumps() avoids


def test_nesting_depth_ignores_brackets_inside_strings() -> None:
    assert jsonio.nesting_depth('{"a": [1, {"b": "[[[{{{"}]}') == 3
    assert jsonio.nesting_depth('"\\"[[" ') == 0
    assert jsonio.nesting_depth("1") == 0


def test_loads_bounds_depth_and_size_before_parsing() -> None:
    deep = "[" * 1000 + "]" * 1000  # 2 KB that json.loads cannot parse (RecursionError)
    with pytest.raises(jsonio.JSONBoundError, match="nested 1000 levels deep, more than 64"):
        jsonio.loads(deep)
    assert jsonio.loads("[" * 64 + "]" * 64) is not None
    with pytest.raises(jsonio.JSONBoundError, match="nested 65 levels deep"):
        jsonio.loads("[" * 65 + "]" * 65)
    assert jsonio.loads("[" * 100 + "]" * 100, max_depth=100) is not None
    with pytest.raises(jsonio.JSONBoundError, match="of 11 characters, more than 10"):
        jsonio.loads('"123456789"', max_chars=10)
    assert jsonio.loads(b'{"a": 1}') == {"a": 1}
    with pytest.raises(ValueError):  # not UTF-8: a ValueError too, as every refusal
        jsonio.loads(b'"\xff"')
    assert issubclass(jsonio.JSONBoundError, ValueError)
