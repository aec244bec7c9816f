"""The upload spec's helpers, exactly (what mutation testing found unchecked:
TESTING.md). The validation itself is tested in tests/fl/test_upload*.py and the
fuzzers."""

from __future__ import annotations

import torch

from osfl.fl.upload import (
    Message,
    MetaSpec,
    TensorSpec,
    UploadSpec,
    _dim,
    _some,
    human_bytes,
    spec_from_state_dict,
)


def test_a_variant_merges_with_its_spec_and_pins_its_name() -> None:
    base = UploadSpec(
        tensors={"w": TensorSpec((2,))},
        max_bytes=500,
        meta={"n": MetaSpec("int")},
        variant_key="form",
        variants={
            "plain": UploadSpec(tensors={"a": TensorSpec((1,))}),
            "open": UploadSpec(optional={"b": TensorSpec((3,))}, allow_extra=True, max_bytes=100),
        },
    )
    plain, open_ = base.variant("plain"), base.variant("open")
    assert set(plain.tensors) == {"w", "a"} and set(open_.optional) == {"b"}
    assert (plain.max_bytes, open_.max_bytes) == (500, 100)
    assert (plain.allow_extra, open_.allow_extra) == (False, True)
    assert plain.meta["form"] == MetaSpec("str", choices=("plain",))
    assert open_.meta["form"].choices == ("open",) and "n" in open_.meta
    extra = UploadSpec(allow_extra=True, variants={"x": UploadSpec()})
    assert extra.variant("x").allow_extra  # either side's allowance carries over
    assert set(extra.variant("x").meta) == set()  # no variant key: nothing pinned


def test_some_names_four_tensors_and_counts_the_rest() -> None:
    assert _some(list("abcdef")) == "tensor(s): a, b, c, d and 2 more"
    assert _some(list("abcd")) == "tensor(s): a, b, c, d"
    assert _some(["x"], shown=1) == "tensor(s): x"


def test_a_metadata_dimension_resolves_or_matches_nothing() -> None:
    meta = {"counts": [3, 5], "n": 7, "name": "x", "table": {1: 9}}
    assert _dim(4, meta) == 4 and _dim(None, meta) is None
    assert _dim("n", meta) == 7 and _dim(("counts", 1), meta) == 5
    for bad in ("name", "missing", ("counts", 2), ("counts", -1), ("table", 1), ("n", 0)):
        assert _dim(bad, meta) == -1, bad


def test_a_state_dict_spec_is_exact() -> None:
    state = {
        "w": torch.zeros(2, 3),
        "bn.running_var": torch.ones(3),
        "bn.num_batches_tracked": torch.tensor(1),
    }
    spec = spec_from_state_dict(state, prefix="m.", max_bytes=1234)
    assert spec.max_bytes == 1234 and set(spec.tensors) == {f"m.{k}" for k in state}
    assert spec.tensors["m.w"] == TensorSpec((2, 3), torch.float32, finite=True, low=None)
    assert spec.tensors["m.bn.running_var"].low == 0.0
    assert spec.tensors["m.bn.num_batches_tracked"].finite is False
    assert spec_from_state_dict(state).max_bytes is None


def test_human_bytes_at_each_unit() -> None:
    cases = {
        1023: "1023 B",
        1024: "1.0 KiB",
        1536: "1.5 KiB",
        1024**2: "1.0 MiB",
        2 * 1024**3: "2.0 GiB",
        3 * 1024**4: "3.0 TiB",
        1024**5: "1024.0 TiB",
    }
    assert {n: human_bytes(n) for n in cases} == cases


def test_metadata_values_are_refused_with_exact_reasons() -> None:
    assert MetaSpec("int").problem("7", {}) == "must be an integer, got str"
    assert MetaSpec("real", low=0.0, high=1.0).problem(1.5, {}) == "1.5 lies outside [0.0, 1.0]"
    assert MetaSpec("real", low=0.0, high=1.0).problem(1, {}) is None
    for bad in (float("nan"), float("inf"), "0.5"):
        assert MetaSpec("real").problem(bad, {}).startswith("must be a finite number, got ")
    # bounds apply to numbers only: a bool's bounds are never compared
    assert MetaSpec("bool", low=0, high=0).problem(True, {}) is None
    assert MetaSpec("str", choices=("a", "b")).problem("c", {}) == "'c' is not one of a, b"
    counts = MetaSpec("int_list", sum_of="n")
    assert counts.problem([1, 2], {"n": 4}) == "sums to 3, not to meta.n=4"
    assert counts.problem([1, 3], {"n": 4}) is None


def test_a_message_counts_its_parameters() -> None:
    m = Message(tensors={"a": torch.zeros(2, 3), "b": torch.zeros(4)}, meta={})
    assert m.num_parameters() == 10
