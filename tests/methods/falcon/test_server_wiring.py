"""What FALCON's server hands to its student's fit and what it records, and
what its spec and screen let through (the mutants of
``osfl.methods.falcon.server`` and ``.screening``; TESTING.md, "Mutation
testing").

``fit`` is replaced by a recorder, so nothing trains: the test checks the
student's fresh init, the pooled sequences and labels in client order, the
teachers' probabilities, the run's device, bar and stream, and each
client's entry of the state.
"""

from __future__ import annotations

import dataclasses
import logging
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError, UploadError
from osfl.fl.seeds import derive_seed
from osfl.fl.upload import Upload, validate
from osfl.methods.falcon import server as server_module
from osfl.methods.falcon.config import NEEDS_VALIDATION
from osfl.methods.falcon.distill import distillation_loss, teacher_probs
from osfl.methods.falcon.upload import (
    CLASSIFIER,
    GENERATOR,
    flatten_state,
    load_flat_state,
    sequence_key,
    sequences_of,
)
from support.simulated_device import simulated_device
from support.tiny import falcon, seed_ctx

V, D = 5, 16  # the tiny task's sequence length and token width


@pytest.fixture
def fits(monkeypatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def recording(model, tensors, loss, cfg, **kw) -> list[float]:
        calls.append(
            {"model": model, "weights": model.state_dict(), "tensors": tensors, "loss": loss}
            | {"cfg": cfg, **kw}
        )
        return [0.0]

    monkeypatch.setattr(server_module, "fit", recording)
    return calls


def _counts(pairs: dict[int, int]) -> list[int]:
    """Per-class counts of all 10 classes from ``{class: count}``."""
    return [pairs.get(c, 0) for c in range(10)]


def _upload(m: Any, counts: dict[int, int], at: float, seed: int) -> Upload:
    """Sequences only (``counts`` per class), and a classifier of ``seed``."""
    torch.manual_seed(seed)
    clf = type(m.new_classifier("x"))(D, 10, m.config.classifier)
    tensors = {CLASSIFIER + k: v for k, v in clf.state_dict().items()}
    for c, n in counts.items():
        tensors[sequence_key(c)] = torch.full((n, V, D), at)
    total = sum(counts.values())
    meta = {"num_samples": total, "synthetic_counts": _counts(counts), "form": "sequences"}
    return Upload(tensors=tensors, meta=meta)


def test_the_student_distils_every_clients_sequences_in_client_order(tiny, fits) -> None:
    ctx = seed_ctx(tiny)
    m = falcon(ctx)
    uploads = {5: _upload(m, {1: 2}, 1.0, 0), 2: _upload(m, {0: 1, 3: 2}, -1.0, 1)}
    state = m.aggregate({"encoder": {"weights": "random"}}, uploads, 0)
    [call] = fits
    x, y, probs = call["tensors"]
    assert y.tolist() == [0, 3, 3, 1, 1] and x.shape == (5, V, D)
    assert torch.equal(x[:3], torch.full((3, V, D), -1.0)) and torch.equal(
        x[3:], torch.ones(2, V, D)
    )
    teachers = [m.new_classifier("t") for _ in range(2)]
    for t, c in zip(teachers, (2, 5), strict=True):
        sd = {
            k[len(CLASSIFIER) :]: v
            for k, v in uploads[c].tensors.items()
            if k.startswith(CLASSIFIER)
        }
        t.load_state_dict(sd)
    torch.testing.assert_close(
        probs, teacher_probs([t.eval() for t in teachers], x, m.config.temperature)
    )
    fresh = m.new_classifier("student-init").state_dict()
    assert all(torch.equal(call["weights"][k], v) for k, v in fresh.items())
    assert call["generator"].initial_seed() == derive_seed(m.run.seed, "falcon-server")
    assert call["device"] == m.run.device and call["progress"] is m.run.progress
    assert call["description"] == "falcon: server student" and call["score"] is None
    assert call["cfg"] == m.config.server_fit
    assert state["clients"][2] == {
        "form": "sequences",
        "num_samples": 3,
        "synthetic": 3,
        "bytes": state["clients"][2]["bytes"],
    }
    assert state["clients"][5]["synthetic"] == 2 and state["encoder"] == {"weights": "random"}
    assert set(state["phases"]["seconds"]) == {"synthetic", "student"}
    assert state["gflops_per_sample"] == m.generation_gflops() > 0


def test_without_kd_the_student_learns_from_labels_only(tiny, fits) -> None:
    m = falcon(seed_ctx(tiny), kd=False)
    m.aggregate({"encoder": {}}, {0: _upload(m, {4: 2}, 0.5, 0)}, 0)
    [call] = fits
    assert len(call["tensors"]) == 2
    x, y = call["tensors"]
    student = m.new_classifier("s").eval()  # no dropout: two forwards agree
    want = distillation_loss(student(x), y, None, m.config.alpha, m.config.temperature)
    assert torch.equal(call["loss"](student, x, y), want)  # no teacher term to index


def test_no_usable_sequence_leaves_the_student_untrained_and_says_so(tiny, fits, caplog) -> None:
    m = falcon(seed_ctx(tiny))
    with caplog.at_level(logging.WARNING, "osfl.methods.falcon.server"):
        state = m.aggregate({"encoder": {}}, {0: _upload(m, {}, 0.0, 0)}, 0)
    assert fits == [] and state["clients"][0]["synthetic"] == 0
    fresh = m.new_classifier("student-init").state_dict()
    assert all(torch.equal(state["student"][k], v) for k, v in fresh.items())
    said = [r.getMessage() for r in caplog.records if r.name == "osfl.methods.falcon.server"]
    assert said == ["falcon: no usable synthetic sequence: the student stays untrained"]


def test_selection_by_validation_scores_the_students_accuracy(tiny) -> None:
    ctx = seed_ctx(tiny)
    m = falcon(ctx, student_selection="validation")
    with pytest.raises(ConfigError):
        m.use_validation(None)
    data = ctx.splits.test.subset(torch.arange(12).numpy())
    m.use_validation(data)
    score = m.validation_score()

    class _Says(torch.nn.Module):
        def __init__(self, label: int):
            super().__init__()
            self.label = label

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.one_hot(torch.full((len(tokens),), self.label), 10).float()

    labels = data.labels
    for label in (int(labels[0]), (int(labels[0]) + 1) % 10):
        assert score(_Says(label)) == pytest.approx(float((labels == label).float().mean()))


def _with_generator(m: Any, counts: dict[int, int], seed: int) -> Upload:
    """The generator form: a classifier of ``seed`` and a generator whose
    weights are the run's init moved by a seeded nudge."""
    up = _upload(m, {}, 0.0, seed)
    torch.manual_seed(seed)
    flat = flatten_state(m.new_generator())
    tensors = {**up.tensors, GENERATOR: flat + 0.01 * torch.randn_like(flat)}
    meta = {"num_samples": sum(counts.values()), "synthetic_counts": _counts(counts)}
    return Upload(tensors=tensors, meta={**meta, "form": "generator"})


def test_each_client_draws_from_its_generator_with_its_own_stream(tiny, fits) -> None:
    m = falcon(seed_ctx(tiny))
    up = _with_generator(m, {1: 3, 4: 2}, 0)
    m.aggregate({"encoder": {}}, {0: up, 3: up}, 0)
    x, y, _ = fits[0]["tensors"]
    assert y.tolist() == [1, 1, 1, 4, 4] * 2 and y.dtype == torch.int64
    for at, client in ((0, 0), (5, 3)):
        gen = m.new_generator()
        load_flat_state(gen, up.tensors[GENERATOR])
        stream = torch.Generator().manual_seed(
            derive_seed(m.run.seed, "falcon-server-sample", client)
        )
        drawn = sequences_of(gen, torch.tensor([0, 3, 0, 0, 2, 0, 0, 0, 0, 0]), stream)
        assert torch.equal(x[at : at + 5], torch.cat([drawn[1], drawn[4]]))
    assert not torch.equal(x[:5], x[5:])  # the same generator, two clients' streams


def test_non_finite_draws_are_dropped_and_counted_per_class(tiny, fits, monkeypatch, caplog):
    m = falcon(seed_ctx(tiny))
    asked: list[tuple[int, list[int]]] = []
    good, bad = torch.ones(V, D), torch.full((V, D), float("nan"))

    def drawn(client: int, up: Upload, counts: torch.Tensor) -> dict[int, torch.Tensor]:
        asked.append((client, counts.tolist()))
        return {2: torch.stack([bad, good * 2, bad]), 7: torch.stack([good * 7])}

    monkeypatch.setattr(m, "_generate", drawn)
    up = _with_generator(m, {2: 3, 7: 1}, 0)
    with caplog.at_level(logging.WARNING, "osfl.methods.falcon.server"):
        m.aggregate({"encoder": {}}, {6: up}, 0)
    assert asked == [(6, [0, 0, 3, 0, 0, 0, 0, 1, 0, 0])]
    x, y, _ = fits[0]["tensors"]
    assert y.tolist() == [2, 7] and torch.equal(x, torch.stack([good * 2, good * 7]))
    said = [r.getMessage() for r in caplog.records if r.name == "osfl.methods.falcon.server"]
    assert said == ["falcon: client 6: 2 non-finite draws of class 2 dropped"]


def test_a_client_with_nothing_usable_adds_no_row_and_keeps_labels_integer(tiny, fits) -> None:
    m = falcon(seed_ctx(tiny))
    m.aggregate({"encoder": {}}, {0: _upload(m, {}, 0.0, 0), 1: _upload(m, {3: 2}, 1.0, 1)}, 0)
    x, y, probs = fits[0]["tensors"]
    assert x.shape == (2, V, D) and y.dtype == torch.int64 and y.tolist() == [3, 3]
    assert probs.shape == (2, 10)


def test_each_clients_bytes_are_split_into_its_parts(tiny, fits) -> None:
    m = falcon(seed_ctx(tiny))
    ups = {0: _upload(m, {3: 2}, 1.0, 0), 1: _with_generator(m, {5: 1}, 1)}
    state = m.aggregate({"encoder": {}}, ups, 0)
    clf = sum(t.numel() * 4 for k, t in ups[0].tensors.items() if k.startswith(CLASSIFIER))
    gen = ups[1].tensors[GENERATOR].numel() * 4
    for c, (seqs, g) in {0: (2 * V * D * 4, 0), 1: (0, gen)}.items():
        got = state["clients"][c]["bytes"]
        assert got == {
            "total": ups[c].nbytes,
            "classifier": clf,
            "sequences": seqs,
            "generator": g,
            "overhead": ups[c].nbytes - clf - seqs - g,
        }
    assert state["clients"][1]["form"] == "generator" and state["clients"][1]["synthetic"] == 1


def test_the_phases_are_timed_each_from_its_own_start(tiny, fits, monkeypatch) -> None:
    ticks = iter([100.0, 100.123456, 200.0, 201.000049])
    monkeypatch.setattr(server_module, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    m = falcon(seed_ctx(tiny))
    state = m.aggregate({"encoder": {}}, {0: _upload(m, {1: 1}, 1.0, 0)}, 0)
    assert state["phases"]["seconds"] == {"synthetic": 0.1235, "student": 1.0}


def test_teachers_student_and_validation_live_on_the_runs_device(tiny, fits, monkeypatch):
    ctx = seed_ctx(tiny)
    tokens = torch.randn(12, V, D)
    monkeypatch.setattr(server_module, "encode_images", lambda *a, **kw: tokens)
    with simulated_device() as dev:
        run = dataclasses.replace(ctx.run, device=dev)
        m = falcon(dataclasses.replace(ctx, run=run), student_selection="validation")
        m.use_validation(ctx.splits.test.subset(torch.arange(12).numpy()))
        m.aggregate({"encoder": {}}, {0: _upload(m, {1: 2}, 1.0, 0)}, 0)
        [call] = fits
        assert all(p.device == dev for p in call["model"].parameters())
        assert 0.0 <= call["score"](call["model"]) <= 1.0  # tokens and labels where it is
    assert call["tensors"][2].device == torch.device("cpu")


def _validation_set(labels: torch.Tensor) -> ImageSet:
    images = torch.zeros(len(labels), 1, 2, 2, dtype=torch.uint8)
    return ImageSet(images, labels, tuple(str(c) for c in range(10)))


class _Reads(torch.nn.Module):
    """Predicts the class written in each sequence's first value, recording
    how many sequences each forward saw."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        self.batches.append(len(tokens))
        return torch.nn.functional.one_hot(tokens[:, 0, 0].long(), 10).float()


def test_validation_encodes_the_set_once_and_scores_in_chunks(tiny, monkeypatch) -> None:
    ctx = seed_ctx(tiny)
    m = falcon(ctx, student_selection="validation")
    labels = torch.arange(2100) % 10
    tokens = torch.zeros(2100, V, D)
    tokens[:, 0, 0] = labels.float()
    tokens[1024, 0, 0] = 9.0  # one miss, at the first chunk's boundary
    encoded: list[tuple[Any, ...]] = []

    def encode(encoder, images, transform, views, **kw) -> torch.Tensor:
        encoded.append((encoder, images, transform, views, kw))
        return tokens

    monkeypatch.setattr(server_module, "encode_images", encode)
    data = _validation_set(labels)
    m.use_validation(data)
    score = m.validation_score()
    [(encoder, images, transform, views, kw)] = encoded
    assert encoder is m.encoder() and images is data.images
    assert transform is m.run.eval_transform and views == m.view_sets()
    assert kw == {
        "batch_size": 256,
        "device": m.run.device,
        "progress": m.run.progress,
        "description": "falcon: validation sequences",
    }
    student = _Reads()
    assert score(student) == 2099 / 2100 and student.batches == [1024, 1024, 52]


def test_one_validation_sample_scores_one_or_zero(tiny, monkeypatch) -> None:
    m = falcon(seed_ctx(tiny), student_selection="validation")
    monkeypatch.setattr(server_module, "encode_images", lambda *a, **kw: torch.full((1, V, D), 4.0))
    m.use_validation(_validation_set(torch.tensor([4])))
    assert m.validation_score()(_Reads()) == 1.0


def test_selection_by_validation_without_a_set_names_what_is_missing(tiny) -> None:
    m = falcon(seed_ctx(tiny), student_selection="validation")
    with pytest.raises(ConfigError) as e:
        m.validation_score()
    assert str(e.value) == NEEDS_VALIDATION


def test_the_generation_count_draws_eight_labels_and_leaves_the_global_stream(
    tiny, monkeypatch
) -> None:
    m = falcon(seed_ctx(tiny))
    seen: list[torch.Tensor] = []

    def count(sample) -> float:
        seen.extend([sample(), sample()])
        return 0.123456789

    monkeypatch.setattr(server_module, "flops_per_sample", count)
    torch.manual_seed(5)
    assert m.generation_gflops() == 0.123457
    after = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(3))  # its draws come from its own stream
    assert seen[0].shape == (8, V, D) and not torch.equal(seen[0], seen[1])


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("sequences in float64", "dtype torch.float64, expected torch.float32"),
        ("a generator in float16", "dtype torch.float16, expected torch.float32"),
        ("a generator one value short", "shape"),
        ("a negative count", "synthetic_counts"),
        ("nine counts", "must have 10 items, got 9"),
    ],
)
def test_the_spec_refuses_each_part_of_the_wrong_type_or_size(tiny, case: str, message: str):
    m = falcon(seed_ctx(tiny))
    spec = m.upload_spec(m.init_state(), 0, 0)
    seqs, gen = _upload(m, {3: 2}, 1.0, 0), _with_generator(m, {3: 2}, 0)
    validate(seqs, spec, client=0)
    validate(gen, spec, client=0)
    bad = {
        "sequences in float64": lambda: Upload(
            {**seqs.tensors, sequence_key(3): seqs.tensors[sequence_key(3)].double()}, seqs.meta
        ),
        "a generator in float16": lambda: Upload(
            {**gen.tensors, GENERATOR: gen.tensors[GENERATOR].half()}, gen.meta
        ),
        "a generator one value short": lambda: Upload(
            {**gen.tensors, GENERATOR: gen.tensors[GENERATOR][:-1]}, gen.meta
        ),
        "a negative count": lambda: Upload(
            seqs.tensors, {**seqs.meta, "synthetic_counts": _counts({3: 2, 5: -1})}
        ),
        "nine counts": lambda: Upload(
            seqs.tensors, {**seqs.meta, "synthetic_counts": _counts({3: 2})[:9]}
        ),
    }[case]()
    with pytest.raises(UploadError, match=message):
        validate(bad, spec, client=0)


def test_the_screen_allows_exactly_the_bound_on_synthetic_sequences(tiny) -> None:
    m = falcon(seed_ctx(tiny))
    bound = -(-m.config.synthetic_ratio * 4 // 1) + 10  # ceil(ratio × 4 samples) + 10 classes
    at = _upload(m, {3: int(bound)}, 1.0, 0)
    at = Upload(at.tensors, {**at.meta, "num_samples": 4})
    assert m.screen({}, 0, 0, at) is None
    over = _upload(m, {3: int(bound) + 1}, 1.0, 0)
    over = Upload(over.tensors, {**over.meta, "num_samples": 4})
    assert m.screen({}, 0, 0, over) == (
        f"meta.synthetic_counts sums to {int(bound) + 1}, more than synthetic_ratio × "
        f"num_samples allows ({int(bound)})"
    )
    nothing = Upload(at.tensors, {**at.meta, "synthetic_counts": [0] * 10})
    assert m.screen({}, 0, 0, nothing) == "meta.synthetic_counts declares no synthetic sequence"


def test_a_class_declared_once_needs_its_sequences(tiny) -> None:
    m = falcon(seed_ctx(tiny))
    up = _upload(m, {3: 2, 6: 1}, 1.0, 0)
    hollow = Upload({k: v for k, v in up.tensors.items() if k != sequence_key(6)}, up.meta)
    assert m.screen({}, 0, 0, up) is None
    assert m.screen({}, 0, 0, hollow) == (
        "meta.synthetic_counts declares class 6 but its sequences are absent"
    )


def test_a_generator_is_probed_with_one_draw_per_declared_class(tiny, monkeypatch) -> None:
    m = falcon(seed_ctx(tiny))
    asked: list[tuple[int, list[int]]] = []
    draws: dict[int, torch.Tensor] = {3: torch.zeros(1, V, D)}

    def probe(client: int, up: Upload, counts: torch.Tensor) -> dict[int, torch.Tensor]:
        asked.append((client, counts.tolist()))
        return draws

    monkeypatch.setattr(m, "_generate", probe)
    up = _with_generator(m, {3: 4, 8: 1}, 0)
    assert m.screen({}, 0, 7, up) is None
    assert asked == [(7, _counts({3: 1, 8: 1}))]
    draws[8] = torch.full((1, V, D), float("inf"))
    assert m.screen({}, 0, 7, up) == "the uploaded generator does not draw finite sequences"
