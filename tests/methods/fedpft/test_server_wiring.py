"""What FedPFT's server hands to its samplers and its fit, the class counts
it accepts, the predictor it builds, and what it releases and reports (the
mutants of ``osfl.methods.fedpft`` the mechanism tests did not see;
TESTING.md, "Mutation testing").

The sampler and the fit are replaced by recorders where a test checks what
they are given (the random stream of each (client, class) mixture, the
run's device, bar and stream), so nothing is trained there.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from osfl.config import method_config
from osfl.errors import UploadError
from osfl.fl.seeds import derive_seed
from osfl.fl.upload import Upload, validate
from osfl.methods import fedpft as fedpft_module
from osfl.methods.fedpft import FedPFT, LinearTokenHead
from support.tiny import FAST_FEDPFT, seed_ctx

D = 16  # the tiny encoder's token width: a mixture row is [weight, mean (D), variance (D)]


def _method(tiny: Any) -> FedPFT:
    return FedPFT(method_config(FedPFT, FAST_FEDPFT), seed_ctx(tiny).run)


def _rows(k: int, at: float) -> torch.Tensor:
    """``k`` equal-weight components at ``at`` with unit variances, float16."""
    weights = torch.full((k, 1), 1 / max(k, 1))
    return torch.cat([weights, torch.full((k, D), at), torch.ones(k, D)], 1).half()


def _upload(counts: list[int], sent: dict[int, torch.Tensor]) -> Upload:
    tensors = {f"gmm.{c}": rows for c, rows in sent.items()}
    return Upload(tensors=tensors, meta={"num_samples": sum(counts), "class_counts": counts})


def _counts(**by_class: int) -> list[int]:
    return [by_class.get(f"c{k}", 0) for k in range(10)]


@pytest.mark.parametrize(
    "counts",
    [
        [3, -1, 0, 0, 0, 0, 0, 0, 0, 0],  # sums to num_samples, one count below 0
        [1, 1],  # two classes of ten
        [0] * 9 + [1, 1],  # eleven
    ],
)
def test_class_counts_are_one_non_negative_count_per_class(tiny, counts: list[int]) -> None:
    m = _method(tiny)
    spec = m.upload_spec({}, 0, 0)
    good = _upload(_counts(c0=2), {0: _rows(2, 0.0)})
    validate(good, spec, client=0)
    with pytest.raises(UploadError, match="class_counts"):
        validate(_upload(counts, {0: _rows(2, 0.0)}), spec, client=0)


def test_each_client_and_class_mixture_is_sampled_from_its_own_stream(tiny, monkeypatch) -> None:
    """n_c draws per (client, class) sent, a class of one sample included,
    each from the run's ``fedpft-sample`` stream of that client and class; a
    mixture of no components, or of a class counted 0, gives none."""
    m = _method(tiny)
    drawn: list[tuple[int, int]] = []

    def recording(rows: torch.Tensor, n: int, g: torch.Generator, reg: float) -> torch.Tensor:
        drawn.append((n, g.initial_seed()))
        return torch.zeros(n, D)

    monkeypatch.setattr(fedpft_module, "sample_gmm_rows", recording)
    uploads = {
        4: _upload(_counts(c1=1, c3=5), {1: _rows(1, 1.0), 3: _rows(2, 3.0)}),
        2: _upload(_counts(c3=2, c5=3, c6=1), {3: _rows(2, 3.0), 6: _rows(0, 0.0)}),
        3: _upload(_counts(c8=2), {8: _rows(2, 8.0), 9: _rows(1, 9.0)}),  # 9: counted 0
    }
    x, y = m.synthetic_features(uploads)
    seed = m.run.seed
    assert drawn == [
        (2, derive_seed(seed, "fedpft-sample", 2, 3)),
        (2, derive_seed(seed, "fedpft-sample", 3, 8)),
        (1, derive_seed(seed, "fedpft-sample", 4, 1)),
        (5, derive_seed(seed, "fedpft-sample", 4, 3)),
    ]
    assert y.tolist() == [3, 3, 8, 8, 1, 3, 3, 3, 3, 3] and x.shape == (10, D)


@pytest.fixture
def fits(monkeypatch) -> list[dict[str, Any]]:
    """``fit`` of the FedPFT module, recording its calls (it trains nothing)."""
    calls: list[dict[str, Any]] = []

    def recording(model, data, loss, cfg, **kw) -> list[float]:
        calls.append({"model": model, "weights": model.state_dict(), "cfg": cfg, **kw})
        return [0.0]

    monkeypatch.setattr(fedpft_module, "fit", recording)
    return calls


def test_the_server_head_starts_from_its_stream_and_fits_on_the_runs_device_and_bar(
    tiny, fits
) -> None:
    m = _method(tiny)
    state = m.aggregate(
        {"encoder": {"weights": "random"}},
        {0: _upload(_counts(c0=3, c2=2), {0: _rows(2, 0.5), 2: _rows(1, -0.5)})},
        0,
    )
    [call] = fits
    torch.manual_seed(derive_seed(m.run.seed, "fedpft-head-init"))
    fresh = LinearTokenHead(D, 10).state_dict()
    assert all(torch.equal(call["weights"][k], v) for k, v in fresh.items())
    assert call["generator"].initial_seed() == derive_seed(m.run.seed, "fedpft-server")
    assert call["device"] == m.run.device and call["progress"] is m.run.progress
    assert call["description"] == "fedpft: server head" and call["cfg"] == m.config.server_fit
    assert state["clients"] == {
        0: {"num_samples": 5, "classes_sent": [0, 2], "bytes": state["clients"][0]["bytes"]}
    }


def test_the_predictor_is_the_encoder_then_the_trained_head(tiny) -> None:
    m = _method(tiny)
    head = LinearTokenHead(D, 10)
    predictor = m.predictor({"head": head.state_dict()})
    images = seed_ctx(tiny).splits.test.images[:4]
    with torch.no_grad():
        logits = predictor(m.run.eval_transform(images))
    assert logits.shape == (4, 10) and torch.isfinite(logits).all()


def test_the_release_is_the_head_only_and_the_report_is_keyed_by_client(tiny) -> None:
    m = _method(tiny)
    head = {"w": torch.ones(2)}
    assert m.release({"encoder": {}, "head": head, "clients": {0: {}}}) == {"head": head}
    assert m.report({"encoder": {"weights": "random"}}) == {
        "encoder": {"weights": "random"},
        "bytes_up": {},
        "classes_sent": {},
        "gflops_per_sample": None,
        "small_classes": "fewer",
    }
    clients = {7: {"bytes": {"gmms": 66}, "classes_sent": [1]}}
    full = m.report({"encoder": {}, "clients": clients, "gflops_per_sample": 0.0})
    assert (full["bytes_up"], full["classes_sent"]) == ({"7": {"gmms": 66}}, {"7": [1]})
