"""FALCON mechanism tests (Liu et al., 2025): each fails when the paper's key
component is removed or inverted.

- The generator models p(s | y) (§2.4, Eqs. 2–4): the class token reaches
  every position's mixture in every variant, and a generator trained on
  classes with different tokens draws different tokens for each class.
- The server distils from the clients' classifiers (§2.6, Eqs. 10–13): with
  α = 1 the student learns what the teachers say (here: a teacher whose
  classes are shifted by one), with α = 0 what the labels say.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from osfl.fl.upload import Upload
from osfl.methods.falcon import GeneratorConfig, SequenceGenerator
from osfl.methods.falcon.upload import CLASSIFIER, sequence_key
from osfl.methods.frozen import FitConfig, fit
from support.tiny import falcon, seed_ctx

D, V, C = 6, 5, 3


@pytest.mark.parametrize("variant", ["mar", "ar", "nar"])
def test_every_position_is_conditioned_on_the_class(variant: str) -> None:
    """The same tokens, another label: every token position's mixture
    parameters change (the class position is seen by all, Eqs. 3–4)."""
    torch.manual_seed(0)
    g = SequenceGenerator(
        D, V, C, GeneratorConfig(depth=2, width=16, heads=2, components=2), variant
    )
    s = torch.randn(4, V, D)
    with torch.no_grad():
        a = g.params(torch.zeros(4, dtype=torch.int64), s)
        b = g.params(torch.full((4,), 2, dtype=torch.int64), s)
    for p, q in zip(a, b, strict=True):
        moved = (p - q).abs().flatten(2).amax(-1).amin(0)  # (V,): least change over the batch
        assert bool((moved > 1e-5).all()), (variant, moved)


def test_a_trained_generator_draws_each_class_its_own_tokens() -> None:
    """Class 0's tokens sit at +2, class 1's at −2 (every position and
    dimension): the trained M-AR generator's draws for each class sit at that
    class's value, not at the pooled mean 0."""
    torch.manual_seed(3)
    n = 192
    y = torch.arange(2).repeat(n // 2)
    s = (2.0 - 4.0 * y.float())[:, None, None] + 0.3 * torch.randn(n, V, D)
    g = SequenceGenerator(D, V, 2, GeneratorConfig(depth=1, width=16, heads=2, components=2), "mar")
    g.set_token_stats(s)
    fit(
        g,
        [s, y],
        lambda m, a, b: m.nll(b, a).mean(),
        FitConfig(epochs=25, batch_size=64, optimizer="adamw", lr=1e-2),
        generator=torch.Generator().manual_seed(0),
    )
    gen = torch.Generator().manual_seed(1)
    for c, value in ((0, 2.0), (1, -2.0)):
        draws = g.sample(torch.full((200,), c, dtype=torch.int64), gen)
        assert abs(float(draws.mean()) - value) < 0.5, (c, float(draws.mean()))
        assert float((draws.mean((1, 2)) * value > 0).float().mean()) > 0.95


def student_agreement(tiny: Any, alpha: float) -> tuple[float, float]:
    """(share of the synthetic sequences the student labels y, share it labels
    y + 1) after the server's distillation from one client whose classifier
    (teacher) predicts y + 1 for class y."""
    ctx = seed_ctx(tiny)
    server = {"epochs": 25, "batch_size": 50, "lr": 5e-3}
    m = falcon(ctx, alpha=alpha, temperature=1.0, server_fit=server)
    v, d = m.sequence_length(), m.token_dim()
    g = torch.Generator().manual_seed(0)
    y = torch.arange(5).repeat_interleave(40)
    x = 3.0 * torch.eye(d)[y][:, None, :].expand(-1, v, -1) + 0.5 * torch.randn(
        200, v, d, generator=g
    )
    teacher = m.new_classifier("classifier-init")
    fit(
        teacher,
        [x, y],
        lambda t, a, b: torch.nn.functional.cross_entropy(t(a), b),
        FitConfig(epochs=30, batch_size=50, lr=5e-3),
        generator=torch.Generator().manual_seed(1),
    )
    teacher.eval()
    with torch.no_grad():
        assert float((teacher(x).argmax(1) == y).float().mean()) > 0.95
        teacher.head.weight.copy_(teacher.head.weight.roll(1, 0))  # class c's row -> c + 1
        teacher.head.bias.copy_(teacher.head.bias.roll(1, 0))
        assert float((teacher(x).argmax(1) == y + 1).float().mean()) > 0.95
    tensors = {CLASSIFIER + k: t.detach().clone() for k, t in teacher.state_dict().items()}
    tensors.update({sequence_key(c): x[y == c].contiguous() for c in range(5)})
    meta = {"num_samples": 200, "synthetic_counts": [40] * 5 + [0] * 5, "form": "sequences"}
    state = m.aggregate(m.init_state(), {0: Upload(tensors, meta)}, 0)
    student = m.new_classifier("student-init")
    student.load_state_dict(state["student"])
    with torch.no_grad():
        pred = student.eval()(x).argmax(1)
    return float((pred == y).float().mean()), float((pred == y + 1).float().mean())


def test_the_server_student_learns_from_the_teachers(tiny) -> None:
    """α = 1 (KD only): the student follows the shifted teacher; α = 0 (CE
    only): the labels. A server that ignored its teachers would follow the
    labels in both."""
    labels, teacher = student_agreement(tiny, 1.0)
    assert teacher > 0.9 and labels < 0.1, (labels, teacher)
    labels, teacher = student_agreement(tiny, 0.0)
    assert labels > 0.9 and teacher < 0.1, (labels, teacher)
