"""What FALCON's server hands to its student's fit and what it records (the
mutants of ``osfl.methods.falcon.server``; TESTING.md, "Mutation testing").

``fit`` is replaced by a recorder, so nothing trains: the test checks the
student's fresh init, the pooled sequences and labels in client order, the
teachers' probabilities, the run's device, bar and stream, and each
client's entry of the state.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from osfl.errors import ConfigError
from osfl.fl.seeds import derive_seed
from osfl.fl.upload import Upload
from osfl.methods.falcon import server as server_module
from osfl.methods.falcon.distill import teacher_probs
from osfl.methods.falcon.upload import CLASSIFIER, sequence_key
from support.tiny import falcon, seed_ctx

V, D = 5, 16  # the tiny task's sequence length and token width


@pytest.fixture
def fits(monkeypatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def recording(model, tensors, loss, cfg, **kw) -> list[float]:
        calls.append({"weights": model.state_dict(), "tensors": tensors, "cfg": cfg, **kw})
        return [0.0]

    monkeypatch.setattr(server_module, "fit", recording)
    return calls


def _upload(m: Any, counts: dict[int, int], at: float, seed: int) -> Upload:
    """Sequences only (``counts`` per class), and a classifier of ``seed``."""
    torch.manual_seed(seed)
    clf = type(m.new_classifier("x"))(D, 10, m.config.classifier)
    tensors = {CLASSIFIER + k: v for k, v in clf.state_dict().items()}
    for c, n in counts.items():
        tensors[sequence_key(c)] = torch.full((n, V, D), at)
    total = sum(counts.values())
    synthetic = [counts.get(c, 0) for c in range(10)]
    meta = {"num_samples": total, "synthetic_counts": synthetic, "form": "sequences"}
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
    assert len(fits[0]["tensors"]) == 2


def test_no_usable_sequence_leaves_the_student_untrained_and_says_so(tiny, fits, caplog) -> None:
    m = falcon(seed_ctx(tiny))
    with caplog.at_level(logging.WARNING, "osfl.methods.falcon.server"):
        state = m.aggregate({"encoder": {}}, {0: _upload(m, {}, 0.0, 0)}, 0)
    assert fits == [] and state["clients"][0]["synthetic"] == 0
    fresh = m.new_classifier("student-init").state_dict()
    assert all(torch.equal(state["student"][k], v) for k, v in fresh.items())
    assert [r.getMessage() for r in caplog.records] == [
        "falcon: no usable synthetic sequence: the student stays untrained"
    ]


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
