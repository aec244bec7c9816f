"""Upload/Broadcast serialisation and validation (docs/design.md §2)."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from osfl.errors import UploadError
from osfl.fl.upload import (
    NUM_SAMPLES,
    Broadcast,
    MetaSpec,
    TensorSpec,
    Upload,
    UploadSpec,
    human_bytes,
    spec_from_state_dict,
    validate,
)

_N = {"num_samples": NUM_SAMPLES}


def _upload() -> Upload:
    return Upload({"w": torch.arange(12, dtype=torch.float32).reshape(3, 4)}, {"num_samples": 7})


def test_round_trip_keeps_tensors_and_meta_exactly() -> None:
    up = _upload()
    back = Upload.from_bytes(up.to_bytes())
    assert isinstance(back, Upload)
    assert back.meta == {"num_samples": 7}
    assert torch.equal(back.tensors["w"], up.tensors["w"])


def test_nbytes_is_the_exact_serialised_length() -> None:
    up = _upload()
    data = up.to_bytes()
    assert up.nbytes == len(data)
    # 12 float32 values = 48 payload bytes plus an 8-byte length and a JSON header.
    header_len = int.from_bytes(data[:8], "little")
    assert len(data) == 8 + header_len + 48
    assert json.loads(data[8 : 8 + header_len])["w"]["dtype"] == "F32"


def test_broadcast_is_a_message_too() -> None:
    b = Broadcast({"g": torch.ones(2)}, {"round": 3})
    assert Broadcast.from_bytes(b.to_bytes()).meta["round"] == 3


def test_non_json_meta_is_refused() -> None:
    with pytest.raises(UploadError, match="meta"):
        Upload({}, {"x": object()}).to_bytes()
    with pytest.raises(UploadError, match="meta"):
        Upload({}, {"x": float("nan")}).to_bytes()


class _Boom:
    """Unpickling this would call print: an upload must never be unpickled."""

    def __reduce__(self):
        return (print, ("unpickled!",))


def test_garbage_and_pickles_are_refused_not_unpickled(capsys) -> None:
    for data in (b"", b"garbage-bytes", pickle.dumps({"a": 1}), pickle.dumps(_Boom())):
        with pytest.raises(UploadError, match=r"\[client 4, field '\*'\]"):
            Upload.from_bytes(data, client=4)
    assert "unpickled" not in capsys.readouterr().out


def test_validate_accepts_a_matching_upload() -> None:
    spec = UploadSpec(
        {"w": TensorSpec((3, None), torch.float32)}, meta={"num_samples": NUM_SAMPLES}
    )
    validate(_upload(), spec, client=1)


@pytest.mark.parametrize(
    ("upload", "spec", "field", "words"),
    [
        (Upload({}), UploadSpec({"w": TensorSpec()}), "w", "missing"),
        (_upload(), UploadSpec({}), "w", "unexpected"),
        (_upload(), UploadSpec({"w": TensorSpec((4, 4))}, meta=_N), "w", "shape"),
        (_upload(), UploadSpec({"w": TensorSpec(dtype=torch.float16)}, meta=_N), "w", "dtype"),
        (
            Upload({"w": torch.tensor([1.0, float("inf")])}),
            UploadSpec({"w": TensorSpec()}),
            "w",
            "NaN or Inf",
        ),
        (
            _upload(),
            UploadSpec({"w": TensorSpec()}, meta={"num_samples": NUM_SAMPLES, "c": MetaSpec()}),
            "meta.c",
            "missing metadata",
        ),
        (_upload(), UploadSpec({"w": TensorSpec()}), "meta.num_samples", "unexpected metadata"),
    ],
)
def test_validate_names_client_and_field(upload, spec, field, words) -> None:
    with pytest.raises(UploadError, match=words) as info:
        validate(upload, spec, client=9)
    assert info.value.client == 9
    assert info.value.field == field
    assert "client 9" in str(info.value)


def test_extra_keys_allowed_when_asked_and_optional_keys_checked() -> None:
    up = Upload({"w": torch.zeros(2), "extra": torch.zeros(1)})
    validate(up, UploadSpec({"w": TensorSpec((2,))}, allow_extra=True))
    with pytest.raises(UploadError, match="shape"):
        validate(up, UploadSpec({"w": TensorSpec((2,))}, optional={"extra": TensorSpec((5,))}))


def test_spec_from_state_dict_matches_the_model_exactly() -> None:
    model = torch.nn.Linear(3, 2)
    spec = spec_from_state_dict(model.state_dict())
    validate(Upload(dict(model.state_dict())), spec)
    bad = dict(model.state_dict())
    bad["bias"] = torch.zeros(3)
    with pytest.raises(UploadError, match="bias"):
        validate(Upload(bad), spec)


def test_human_bytes() -> None:
    assert human_bytes(512) == "512 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(3 * 1024**2) == "3.0 MiB"


def _meta_spec() -> UploadSpec:
    counts = MetaSpec("int_list", low=0, length=3, sum_of="num_samples")
    return UploadSpec({"w": TensorSpec()}, meta={"num_samples": NUM_SAMPLES, "counts": counts})


@pytest.mark.parametrize(
    ("meta", "field", "words"),
    [
        ({"num_samples": 0, "counts": [0, 0, 0]}, "meta.num_samples", "outside"),
        ({"num_samples": -3, "counts": [0, 0, 0]}, "meta.num_samples", "outside"),
        ({"num_samples": True, "counts": [1, 0, 0]}, "meta.num_samples", "integer"),
        ({"num_samples": "7", "counts": [7, 0, 0]}, "meta.num_samples", "integer"),
        ({"num_samples": 7.0, "counts": [7, 0, 0]}, "meta.num_samples", "integer"),
        ({"num_samples": 7, "counts": [7, 0]}, "meta.counts", "3 items"),
        ({"num_samples": 7, "counts": [8, -1, 0]}, "meta.counts", "outside"),
        ({"num_samples": 7, "counts": [1, 1, 1]}, "meta.counts", "sums to 3"),
        ({"num_samples": 7, "counts": [7, 0, "0"]}, "meta.counts", "list of integers"),
    ],
)
def test_typed_metadata_is_checked_by_kind_range_length_and_sum(meta, field, words) -> None:
    up = Upload({"w": torch.zeros(2)}, meta)
    with pytest.raises(UploadError, match=words) as info:
        validate(up, _meta_spec(), client=2)
    assert info.value.field == field and info.value.client == 2


def test_typed_metadata_accepts_a_consistent_upload() -> None:
    validate(Upload({"w": torch.zeros(2)}, {"num_samples": 7, "counts": [3, 4, 0]}), _meta_spec())


def test_size_is_checked_on_the_raw_bytes_before_parsing() -> None:
    from osfl.fl.upload import META_ALLOWANCE, receive, size_limit

    spec = UploadSpec({"w": TensorSpec((3, 4), torch.float32)}, meta=_N)
    assert size_limit(spec) == 12 * 4 + len(b"w") + 128 + META_ALLOWANCE
    raw = _upload().to_bytes()
    assert receive(raw, spec, client=1).meta == {"num_samples": 7}
    with pytest.raises(UploadError, match="exceeds the limit of 10") as info:
        receive(raw, spec, client=1, limit=10)
    assert info.value.field == "*" and info.value.client == 1
    # junk metadata far beyond the allowance is refused before it is parsed
    junk = Upload(_upload().tensors, {"num_samples": 7, "pad": "x" * (2 * META_ALLOWANCE)})
    with pytest.raises(UploadError, match="exceeds the limit"):
        receive(junk.to_bytes(), spec, client=2)
    assert size_limit(UploadSpec({"w": TensorSpec((None, 4), torch.float32)})) is None  # open


def test_value_ranges_refuse_a_negative_batchnorm_variance() -> None:
    state = {"bn.running_var": torch.ones(3), "bn.weight": torch.ones(3)}
    spec = spec_from_state_dict(state)
    validate(Upload(dict(state)), spec)
    bad = {**state, "bn.running_var": torch.tensor([1.0, -1e6, 1.0])}
    with pytest.raises(UploadError, match=r"below 0\.0") as info:
        validate(Upload(bad), spec, client=3)
    assert info.value.field == "bn.running_var"
    validate(Upload({**state, "bn.weight": -torch.ones(3)}), spec)  # weights may be negative


def test_a_dimension_may_name_a_metadata_value() -> None:
    spec = UploadSpec(
        optional={f"x.{c}": TensorSpec((("counts", c), 2), torch.float32) for c in range(3)},
        tensors={"all": TensorSpec(("num_samples", 2), torch.float32)},
        meta={"num_samples": NUM_SAMPLES, "counts": MetaSpec("int_list", low=0, length=3)},
    )
    meta = {"num_samples": 5, "counts": [2, 0, 3]}
    good = {"all": torch.zeros(5, 2), "x.0": torch.zeros(2, 2), "x.2": torch.zeros(3, 2)}
    validate(Upload(good, meta), spec)
    for name, wrong in [("x.2", torch.zeros(4, 2)), ("all", torch.zeros(4, 2))]:
        with pytest.raises(UploadError, match="shape") as info:
            validate(Upload({**good, name: wrong}, meta), spec, client=1)
        assert info.value.field == name
    from osfl.fl.upload import size_limit

    assert size_limit(spec) is None  # sized by metadata: no bound known before parsing
