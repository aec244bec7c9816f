"""FedFTG's server losses term by term, with every client distinguishable.

One server iteration (one generator step per client, one distillation step)
runs on hand-made clients whose class counts differ per class, so the
class-level weights α_k^y = n_k^y / Σ_k n_k^y differ per client *and* per
class (the labels are fixed by hand). The losses the server logs are then
checked against the formulas of the module docstring (Zhang et al., CVPR
2022; the authors' code), written out here:

- generator, client k (the last one is logged):
  −mean_b(α_k^{y_b} · mean_c |s − t_k|) + mean_b(α_k^{y_b} · CE(t_k, y))
  + diversity / M;
- server model: mean(−log_softmax(s) ⊙ Σ_k α_k^y softmax(t_k)) (the logged
  value is that times K).

Pairing client k with another client's weights, dropping the class weights,
ignoring the labels in the target, or exchanging the student and the target
in the soft cross-entropy each changes a logged value.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from osfl.config import method_config
from osfl.fl.method import METHODS
from osfl.methods.kd import fedftg as fedftg_module
from osfl.methods.kd.base import PhaseTimer, ServerSide
from osfl.methods.kd.space import InputSpace
from osfl.methods.kd.teacher import EnsembleTeacher
from support.smoke import smoke_config, smoke_context

COUNTS = [[6, 0, 1, 2, 0, 0, 0, 0, 0, 0], [2, 4, 3, 0, 0, 0, 0, 0, 0, 0]]
LABELS = torch.tensor([0, 1, 2, 3, 0, 2])


class Recorder(EnsembleTeacher):
    """The teacher, remembering the member logits of the distillation batch."""

    def member_logits(self, x: torch.Tensor) -> torch.Tensor:
        out = super().member_logits(x)
        self.seen = (x.detach().clone(), out.detach().clone())
        return out


@pytest.fixture(scope="module")
def run() -> Any:
    return smoke_context(smoke_config("fedftg")).run


def test_fedftg_generator_and_server_losses_by_hand(
    run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    num_classes = run.num_classes
    d = int(np.prod(run.image_shape))
    g = torch.Generator().manual_seed(0)

    def linear(scale: float) -> nn.Module:
        m = nn.Sequential(nn.Flatten(1), nn.Linear(d, num_classes))
        with torch.no_grad():
            m[1].weight.copy_(scale * torch.randn(num_classes, d, generator=g))
            m[1].bias.copy_(scale * torch.randn(num_classes, generator=g))
        return m.eval()

    members = [linear(1.0), linear(3.0)]
    student = linear(0.5)
    logged: dict[str, float] = {}
    l1_calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    div: list[float] = []
    student_out: list[torch.Tensor] = []
    real_l1, real_div = fedftg_module.l1_discrepancy, fedftg_module.diversity_loss

    def l1_spy(s: torch.Tensor, t: torch.Tensor, w: Any = None) -> torch.Tensor:
        l1_calls.append((s.detach().clone(), t.detach().clone()))
        return real_l1(s, t, w)

    def div_spy(z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        out = real_div(z, x)
        div.append(float(out.detach()))
        return out

    monkeypatch.setattr(fedftg_module, "l1_discrepancy", l1_spy)
    monkeypatch.setattr(fedftg_module, "diversity_loss", div_spy)
    monkeypatch.setattr(fedftg_module, "customised_labels", lambda total, c, gen: LABELS.clone())
    monkeypatch.setattr(fedftg_module, "epoch_log", lambda *a, **kw: logged.update(kw))
    student.register_forward_hook(lambda m, i, o: student_out.append(o.detach().clone()))

    cls = METHODS.get("fedftg")
    opts = {
        "epochs": 1,
        "synthesis_batch_size": len(LABELS),
        "inner_steps": 1,
        "generator": {"nz": 8, "ngf": 8, "steps": 1},
    }
    method = cls(method_config(cls, opts), run)
    side = ServerSide(
        run=run,
        device=torch.device("cpu"),
        generator=torch.Generator().manual_seed(0),
        space=InputSpace.identity(run.image_shape[0]),
        client_ids=[0, 1],
        num_samples=[sum(c) for c in COUNTS],
        timer=PhaseTimer(),
        meta={k: {"class_counts": c} for k, c in enumerate(COUNTS)},
    )
    teacher = method.build_teacher(side, members)
    teacher.__class__ = Recorder
    method.server_train(side, teacher, student)

    counts = torch.tensor(COUNTS, dtype=torch.float32)
    alpha = counts / counts.sum(0, keepdim=True).clamp(min=1)  # α_k^y, over the clients
    w = alpha[:, LABELS]  # (M, B)
    assert float((w[0] - w[1]).abs().min()) > 0.1  # every sample weighs the two differently

    # generator: the last client's loss (the one logged)
    s, t = l1_calls[-1]
    k = len(members) - 1
    disc = (w[k] * (s - t).abs().mean(1)).mean()
    ce = (F.cross_entropy(t, LABELS, reduction="none") * w[k]).mean()
    want_g = -disc + ce + div[-1] / len(members)
    assert logged["g_loss"] == pytest.approx(float(want_g), rel=1e-5)

    # server: soft cross-entropy against the class-level ensemble
    _, member_logits = teacher.seen
    target = (w[:, :, None] * F.softmax(member_logits, -1)).sum(0)
    s_logits = student_out[-1]
    want_s = float((-F.log_softmax(s_logits, -1) * target).mean()) * num_classes
    assert logged["s_loss"] == pytest.approx(want_s, rel=1e-5)


def test_class_weights_normalise_over_the_clients() -> None:
    """α_k^y = n_k^y / Σ_k n_k^y, column by column (an absent class: zeros);
    the rows are not distributions over the classes."""
    got = fedftg_module.client_class_weights(np.array([[2, 0, 6], [2, 4, 2]]))
    assert got.tolist() == [[0.5, 0.0, 0.75], [0.5, 1.0, 0.25]]
