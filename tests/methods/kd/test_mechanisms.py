"""Mechanism tests of the data-free distillation servers (DeepInversion, ADI,
DENSE, Co-Boosting, FedFTG) and of the distillation servers with a transfer
set (FedDF, PriorKD): each test fails when the paper's key component is
removed or inverted.

All of them share one set of clients: the three digit clients of FedFTG's
smoke task (8 px, a non-IID split where FedAvg is weak and the ensemble
strong), trained once for the module; each server then runs ``aggregate``
on their uploads with a budget of a few steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from osfl import assembly
from osfl.config import method_config
from osfl.fl.method import METHODS
from osfl.methods.clients import model_from_state
from osfl.methods.kd import coboosting as coboosting_module
from osfl.methods.kd import deepinversion as deepinversion_module
from osfl.methods.kd import dense as dense_module
from osfl.methods.kd import fedftg as fedftg_module
from osfl.methods.kd.coboosting import hard_sample_ce, ods_perturb
from osfl.methods.kd.generator import Generator, synthesize
from osfl.methods.kd.pixels import InversionConfig, invert
from osfl.methods.kd.priors import BNStatsLoss, js_divergence
from osfl.methods.kd.space import InputSpace
from osfl.methods.kd.teacher import EnsembleTeacher
from support.smoke import first_aggregation, smoke_config, smoke_context


class Task:
    """The trained clients, their uploads and the test images they are judged on."""

    def __init__(self) -> None:
        cfg = smoke_config("fedftg")  # its uploads also carry the class counts FedFTG needs
        ctx = smoke_context(cfg)
        self.run = ctx.run
        self.state, self.uploads = first_aggregation(assembly.build_job(cfg, "fedftg", ctx))
        self.ids = sorted(self.uploads)
        self.x = self.run.eval_transform(ctx.splits.test.images)
        self.members = [self.client(c) for c in self.ids]
        with torch.no_grad():
            self.ensemble = torch.stack([m(self.x) for m in self.members]).mean(0)

    def ensemble_of(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([m(x) for m in self.members]).mean(0)

    def client(self, c: int) -> nn.Module:
        return model_from_state(self.run, self.uploads[c].tensors).eval()

    def method(self, name: str, cls: type | None = None, **options: Any) -> Any:
        registered = METHODS.get(name)
        return (cls or registered)(method_config(registered, options), self.run)

    def serve(self, method: Any) -> dict[str, Any]:
        return method.aggregate(self.state, self.uploads, 0)

    def agreement(self, state: dict[str, torch.Tensor]) -> float:
        """Share of the test images on which a model predicts the ensemble's class."""
        with torch.no_grad():
            out = model_from_state(self.run, state).eval()(self.x)
        return float((out.argmax(1) == self.ensemble.argmax(1)).float().mean())


@pytest.fixture(scope="module")
def task() -> Task:
    return Task()


class Const(nn.Module):
    """A "client" that answers class 0 whatever the input (``0 · x`` keeps the
    input gradient that synthesis differentiates through)."""

    def __init__(self, classes: int):
        super().__init__()
        self.register_buffer("logits", torch.tensor([6.0] + [0.0] * (classes - 1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(x.shape[0], -1) + 0 * x.flatten(1).sum(1, keepdim=True)


def constant_teachers(cls: type) -> type:
    """``cls`` whose teacher's members are replaced by :class:`Const` (same weights)."""

    class ConstantTeachers(cls):  # type: ignore[misc,valid-type]
        def build_teacher(self, side, models):
            teacher = super().build_teacher(side, models)
            teacher.members = nn.ModuleList([Const(side.num_classes) for _ in models])
            return teacher

    return ConstantTeachers


#: Tiny server budgets, one per method (each runs in well under a second).
BUDGETS: dict[str, dict[str, Any]] = {
    "dense": {
        "epochs": 2,
        "synthesis_batch_size": 32,
        "generator": {"steps": 5},
        "distill": {"batch_size": 32, "steps": 20, "lr": 0.05, "temperature": 4.0},
    },
    "coboosting": {
        "epochs": 2,
        "synthesis_batch_size": 32,
        "generator": {"steps": 5},
        "distill": {"batch_size": 32, "steps": 20, "lr": 0.05, "schedule": "constant"},
    },
    "deepinversion": {
        "epochs": 2,
        "synthesis_batch_size": 16,
        "inversion": {"iterations": 10, "lr": 0.05, "bn_weight": 0.1},
        "distill": {"steps": 15, "lr": 0.01},
    },
    "adi": {
        "epochs": 2,
        "synthesis_batch_size": 16,
        "inversion": {"iterations": 10, "lr": 0.05, "bn_weight": 0.1, "js_weight": 1.0},
        "distill": {"steps": 15, "lr": 0.01},
    },
    "fedftg": {"epochs": 3},
    "feddf": {"public": "digits", "public_split": "test", "distill": {"steps": 30}},
    "priorkd": {"prior": "dataset:digits", "per_class": 20, "distill": {"steps": 30}},
}


# --------------------------------------------------------------------------- every server
@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_the_teachers_move_the_student_towards_the_ensemble(task: Task, name: str) -> None:
    """Knowledge distillation from the client ensemble (Hinton et al., 2015, as
    every one of these servers uses it: Lin et al., FedDF, NeurIPS 2020; Zhang
    et al., DENSE, NeurIPS 2022; Dai et al., Co-Boosting, ICLR 2024; Yin et
    al., DeepInversion, CVPR 2020; Zhang et al., FedFTG, CVPR 2022): the
    server model ends closer to the ensemble's predictions than it started,
    and with the teachers replaced by a constant it ends elsewhere."""
    method = task.method(name, **BUDGETS[name])
    start = task.agreement(task.state["init"] if method.config.init == "scratch" else fedavg(task))
    got = task.agreement(task.serve(method)["server"])
    assert got > start + 0.03, (name, start, got)
    const = task.method(name, constant_teachers(METHODS.get(name)), **BUDGETS[name])
    assert task.agreement(task.serve(const)["server"]) < got - 0.2


def fedavg(task: Task) -> dict[str, torch.Tensor]:
    method = task.method("fedavg")
    return method.aggregate(method.init_state(), task.uploads, 0)


# --------------------------------------------------------------------------- DeepInversion / ADI
def _invert(model: nn.Module, seed: int = 0, student: nn.Module | None = None, **cfg: Any):
    inv = InversionConfig(iterations=15, lr=0.1, jitter=0, flip=False, **cfg)
    bn = BNStatsLoss([model])
    try:
        return invert(
            lambda x, _: model(x),
            torch.arange(16) % 10,
            (1, 8, 8),
            inv,
            bn=bn,
            student=(lambda x, _: student(x)) if student is not None else None,
            generator=torch.Generator().manual_seed(seed),
        )
    finally:
        bn.remove()


def _bn_distance(model: nn.Module, images: torch.Tensor) -> float:
    with BNStatsLoss([model]) as bn, bn.capture(), torch.no_grad():
        model(images)
        return float(bn.value())


def test_deepinversion_bn_term_pulls_batch_statistics_to_the_running_ones(task: Task) -> None:
    """DeepInversion's feature-distribution regulariser (Yin et al., CVPR 2020,
    Eq. 4): optimising the pixels with the BN-statistics term brings the
    batch's per-layer mean and variance closer to the client's running
    statistics than the same inversion without it."""
    model = task.members[0]
    without = _invert(model, bn_weight=0.0)
    with_bn = _invert(model, bn_weight=1.0)
    assert with_bn.losses["bn"] > 0 and "bn" not in without.losses
    assert _bn_distance(model, with_bn.images) < 0.7 * _bn_distance(model, without.images)


def test_adi_competition_makes_teacher_and_student_disagree(task: Task) -> None:
    """Adaptive DeepInversion's competition term (Yin et al., CVPR 2020, Eq. 7:
    the images maximise the teacher/student Jensen-Shannon divergence): the
    same inversion with the JS term ends with a larger teacher/student JS."""
    teacher, student = task.members[0], task.members[1]

    def js(images: torch.Tensor) -> float:
        with torch.no_grad():
            return float(js_divergence(teacher(images), student(images), 3.0))

    plain = _invert(teacher, student=student, bn_weight=0.1)
    adi = _invert(teacher, student=student, bn_weight=0.1, js_weight=5.0)
    assert adi.losses["js"] < 0
    assert js(adi.images) > js(plain.images) + 0.01


def _record_inversions(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    real = deepinversion_module.invert

    def spy(forward, labels, image_shape, cfg, **kw):
        res = real(forward, labels, image_shape, cfg, **kw)
        calls.append({"forward": forward, "cfg": cfg, "result": res, **kw})
        return res

    monkeypatch.setattr(deepinversion_module, "invert", spy)
    return calls


def test_adi_competes_with_the_server_student(task: Task, monkeypatch) -> None:
    """ADI's competition term compares the teacher with the *student* being
    distilled (Yin et al., CVPR 2020, §3.3): the model the inversion competes
    with is the server model the run returns."""
    calls = _record_inversions(monkeypatch)
    state = task.serve(task.method("adi", **{**BUDGETS["adi"], "epochs": 1}))
    assert calls and all(c["student"] is not None for c in calls)
    server = model_from_state(task.run, state["server"]).eval()
    with torch.no_grad():
        torch.testing.assert_close(calls[-1]["student"](task.x[:8], None), server(task.x[:8]))
    calls.clear()
    task.serve(task.method("deepinversion", **{**BUDGETS["deepinversion"], "epochs": 1}))
    assert calls and all(c["student"] is None for c in calls)  # no competition in plain DI


def test_deepinversion_inverts_each_client_with_its_own_bn_statistics(
    task: Task, monkeypatch
) -> None:
    """FedMITR's DeepInversion baseline inverts "about each local model"
    (Appendix A): per epoch one batch per client, each matching *that*
    client's BN statistics; ``target=ensemble`` inverts the ensemble once per
    epoch with every client's BN layers, their summed terms averaged over the
    clients."""
    calls = _record_inversions(monkeypatch)
    task.serve(task.method("deepinversion", **{**BUDGETS["deepinversion"], "epochs": 1}))
    assert len(calls) == len(task.ids)
    probe = task.x[:4]
    for call, member in zip(calls, task.members, strict=True):
        with torch.no_grad():
            (own,) = call["bn"].models
            torch.testing.assert_close(own(probe), member(probe))
            torch.testing.assert_close(call["forward"](probe, None), member(probe))
        assert call["result"].losses["bn"] > 0 and call["cfg"].bn_weight == 0.1
    calls.clear()
    task.serve(task.method("deepinversion", target="ensemble", **BUDGETS["deepinversion"]))
    assert len(calls) == BUDGETS["deepinversion"]["epochs"]
    for call in calls:  # the mean over the clients of their summed BN terms
        assert len(call["bn"].models) == len(task.ids)
        assert call["cfg"].bn_weight == pytest.approx(0.1 / len(task.ids))
        with torch.no_grad():
            torch.testing.assert_close(call["forward"](probe, None), task.ensemble_of(probe))


# --------------------------------------------------------------------------- DENSE
def test_dense_generator_is_trained_towards_the_teacher(task: Task) -> None:
    """DENSE's data generation (Zhang et al., NeurIPS 2022, §3.2): the
    generator's parameters are optimised, and the images it ends with are
    classified as their labels by the ensemble more often than those of the
    untrained generator; each round restarts from a fresh DCGAN initialisation."""
    teacher = EnsembleTeacher(task.members)
    space = InputSpace.from_transform(task.run.eval_transform, 1)
    labels = torch.arange(40) % 10
    snapshot: dict[str, torch.Tensor] = {}

    def loss_fn(x: torch.Tensor, y: torch.Tensor):
        if not snapshot:
            snapshot.update({k: v.detach().clone() for k, v in gen.state_dict().items()})
        loss = F.cross_entropy(teacher(x), y)
        return loss, {"oh": float(loss.detach())}

    def agreement(iterations: int) -> float:
        snapshot.clear()
        x, _ = synthesize(
            gen,
            labels,
            loss_fn,
            iterations=iterations,
            lr=0.01,
            space=space,
            rng=torch.Generator().manual_seed(0),
        )
        with torch.no_grad():
            return float((teacher(x).argmax(1) == labels).float().mean())

    torch.manual_seed(0)
    gen = Generator(nz=16, ngf=8, img_size=8, channels=1)
    untrained = agreement(1)  # the first iterate: the freshly reset generator's batch
    trained = agreement(25)
    assert trained > untrained + 0.2
    changed = [k for k, v in gen.state_dict().items() if not torch.equal(v, snapshot[k])]
    assert any(k.startswith("l1.") for k in changed) and any(
        k.startswith("blocks.") for k in changed
    )
    # every round starts from a re-initialised generator (DENSE's and Co-Boosting's
    # ``reset_model``), not from the one the last round trained
    trained_state = {k: v.detach().clone() for k, v in gen.state_dict().items()}
    agreement(1)
    assert not torch.equal(snapshot["l1.weight"], trained_state["l1.weight"])
    assert float(snapshot["l1.weight"].std()) == pytest.approx(0.02, rel=0.1)  # N(0, 0.02)


def _record_batches(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[tuple]:
    batches: list[tuple] = []
    real = dense_module.synthesize_batch

    def spy(side, cfg, batch_size, gen, loss_fn):
        out = real(side, cfg, batch_size, gen, loss_fn)
        batches.append(out)
        return out

    monkeypatch.setattr(module, "synthesize_batch", spy)
    return batches


def test_dense_synthesis_follows_its_loss_terms(task: Task, monkeypatch) -> None:
    """DENSE's generator loss (Zhang et al., NeurIPS 2022, Eq. 5-7): with the
    CE term alone, more generator steps give images the ensemble labels as
    asked, and with every term off the generator does not move; the BN term
    brings the images' statistics to every client's running ones.

    The CE term is measured alone: with the BN and adversarial terms on, the
    gain over 15 steps is 0.1-0.2 of agreement and moves by as much across
    CPU kernel paths; alone it is 0.56-0.66 on every path measured (native,
    AVX2, SSE4.1)."""
    batches = _record_batches(monkeypatch, dense_module)
    teacher = EnsembleTeacher(task.members)
    one = {**BUDGETS["dense"], "epochs": 1, "bn_weight": 0.0, "adv_weight": 0.0}

    def synthetic(**options: Any) -> tuple[torch.Tensor, torch.Tensor]:
        batches.clear()
        task.serve(task.method("dense", **{**one, **options}))
        ((x, y, _terms),) = batches
        return x, y

    def agreement_and_ce(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        with torch.no_grad():
            out = teacher(x)
        return float((out.argmax(1) == y).float().mean()), float(F.cross_entropy(out, y))

    def steps(n: int) -> dict[str, Any]:
        return {"generator": {"steps": n, "lr": 0.01}}

    short = agreement_and_ce(*synthetic(**steps(1)))
    long = agreement_and_ce(*synthetic(**steps(15)))
    assert long[0] > short[0] + 0.4
    assert long[1] < 0.6 * short[1]
    still = agreement_and_ce(*synthetic(**steps(15), oh_weight=0.0))
    assert still == short  # no term, no gradient: the generator stays where it started

    bn_off = synthetic(**steps(15), bn_weight=0.0)[0]
    bn_on = synthetic(**steps(15), bn_weight=5.0)[0]
    distance = {
        k: sum(_bn_distance(m, x) for m in task.members)
        for k, x in (("off", bn_off), ("on", bn_on))
    }
    assert distance["on"] < distance["off"]


class _Captured(Exception):
    """Stops DENSE's server once its generator loss is in hand."""


def test_dense_generator_loss_term_by_term(task: Task, monkeypatch) -> None:
    """DENSE's generator loss (Zhang et al., NeurIPS 2022, Eq. 5-7; the
    authors' ``helpers/synthesizers.py``) on a fixed batch, each term against
    its definition: ``bn`` is the BN-statistics loss summed over every BN
    layer of every client (``sum(h.r_feature for h in hooks)``), ``oh`` the
    ensemble's CE, and ``adv`` the negative KL of the student from the
    *ensemble* (the target), masked to the samples where their argmaxes
    differ."""
    torch.manual_seed(0)
    x = task.x[:16].clone()
    y = torch.randint(0, task.run.num_classes, (16,))
    captured: dict[str, Any] = {}

    def stop(side, cfg, batch_size, gen, loss_fn):
        captured["terms"] = loss_fn(x, y)[1]  # while the server's BN hooks are in place
        raise _Captured

    calls: list[tuple] = []
    real_adv = dense_module.adversarial_kl

    def adv_spy(s, t, temperature, masked):
        calls.append((s.detach().clone(), t.detach().clone(), temperature, masked))
        return real_adv(s, t, temperature, masked=masked)

    monkeypatch.setattr(dense_module, "synthesize_batch", stop)
    monkeypatch.setattr(dense_module, "adversarial_kl", adv_spy)
    weights = {"bn_weight": 0.7, "oh_weight": 1.3, "adv_weight": 0.9}
    with pytest.raises(_Captured):
        task.serve(task.method("dense", **{**BUDGETS["dense"], **weights}))
    terms = captured["terms"]

    ensemble = EnsembleTeacher(task.members)
    with torch.no_grad():
        t = ensemble(x)
    per_layer_sum = 0.0
    for m in task.members:
        with BNStatsLoss([m]) as bn, bn.capture(), torch.no_grad():
            m(x)
            per_layer_sum += float(bn.value("sum"))
    assert terms["bn"] == pytest.approx(0.7 * per_layer_sum, rel=1e-5)
    assert terms["oh"] == pytest.approx(1.3 * float(F.cross_entropy(t, y)), rel=1e-5)
    ((s, t_seen, temperature, masked),) = calls
    torch.testing.assert_close(t_seen, t)  # the ensemble is the target, the student the other
    assert masked is True
    p_t, log_s = F.softmax(t / temperature, 1), F.log_softmax(s / temperature, 1)
    kl = (p_t * (p_t.log() - log_s)).sum(1) * temperature**2
    mask = (s.argmax(1) != t.argmax(1)).float()
    assert terms["adv"] == pytest.approx(-0.9 * float((kl * mask).mean()), rel=1e-4, abs=1e-7)


# --------------------------------------------------------------------------- Co-Boosting
def test_coboosting_hard_sample_weight_by_hand() -> None:
    """Co-Boosting's hard-sample loss (Dai et al., ICLR 2024, Eq. 4 / the
    code's ``loss_oh``): each sample's CE weighted by ``(1 - p_y)^h``, the
    weight detached, so the samples the ensemble gets wrong dominate."""
    logits = torch.tensor([[4.0, 0.0, 0.0], [0.0, 2.0, 0.0]], requires_grad=True)
    y = torch.tensor([0, 0])  # sample 0 easy, sample 1 hard (the ensemble says class 1)
    p = F.softmax(logits.detach(), 1)[torch.arange(2), y]
    ce = F.cross_entropy(logits.detach(), y, reduction="none")
    loss = hard_sample_ce(logits, y, 1.0)
    torch.testing.assert_close(loss, ((1 - p) * ce).mean())
    loss.backward()
    grad_ce = (F.softmax(logits.detach(), 1) - F.one_hot(y, 3)) / 2
    torch.testing.assert_close(logits.grad, (1 - p)[:, None] * grad_ce)
    assert (1 - p[1]) > 5 * (1 - p[0])  # the disagreement carries the weight
    torch.testing.assert_close(hard_sample_ce(logits, y, 0.0), F.cross_entropy(logits, y))
    torch.testing.assert_close(hard_sample_ce(logits, y, 2.0), ((1 - p) ** 2 * ce).mean())


class KeepsTeacher:
    """Mixin: remember the teacher the server built."""

    def build_teacher(self, side, models):
        self.teacher = super().build_teacher(side, models)  # type: ignore[misc]
        return self.teacher


def test_coboosting_learns_the_ensemble_weights(task: Task) -> None:
    """Co-Boosting's ensemble boosting (Dai et al., ICLR 2024, §4.2): from the
    second epoch on, the client weights take signed-gradient steps on the
    pool's CE, so they leave the uniform start; ``weighted=false`` keeps
    them uniform."""
    cls = type("Spy", (KeepsTeacher, METHODS.get("coboosting")), {})
    options = {**BUDGETS["coboosting"], "epochs": 3, "mu": 0.05}
    learned = task.method("coboosting", cls, **options)
    task.serve(learned)
    w = learned.teacher.weights
    uniform = torch.full_like(w, 1 / len(task.ids))
    assert float((w - uniform).abs().max()) > 0.04
    # two updates of step mu·wdc^e (e = 1, 2) per pool batch: no farther than that
    assert float((w - uniform).abs().max()) <= 0.05 * (0.99 + 0.99**2) * 2 + 1e-6
    fixed = task.method("coboosting", cls, weighted=False, **options)
    task.serve(fixed)
    torch.testing.assert_close(fixed.teacher.weights, uniform)


def test_coboosting_perturbation_ascends_the_random_projection(task: Task) -> None:
    """The ODS perturbation of Co-Boosting's KD (Tashiro et al., NeurIPS 2020;
    Dai et al., ICLR 2024, §4.3): a signed step of size eps *up* the gradient
    of ``r · softmax(E(x)/T)``, so the projection grows."""
    teacher = EnsembleTeacher(task.members)
    x = task.x[:32]
    eps, temperature = 0.1, 4.0
    xp = ods_perturb(teacher, x, eps, temperature, torch.Generator().manual_seed(3))
    moved = (xp - x).abs()
    assert float(moved.max()) == pytest.approx(eps) and float((moved > 0).float().mean()) > 0.5
    with torch.no_grad():
        out = F.softmax(teacher(x) / temperature, dim=-1)
        r = torch.rand(out.shape, generator=torch.Generator().manual_seed(3)) * 2 - 1
        before = (r * out).sum()
        after = (r * F.softmax(teacher(xp) / temperature, dim=-1)).sum()
    assert float(after) > float(before)
    assert ods_perturb(teacher, x, 0.0, temperature, None) is x


def _kl_t2(target: torch.Tensor, other: torch.Tensor, temperature: float) -> torch.Tensor:
    """Per-sample ``T² · KL(softmax(target/T) || softmax(other/T))``, written out."""
    p = F.softmax(target / temperature, 1)
    return (p * (p.log() - F.log_softmax(other / temperature, 1))).sum(1) * temperature**2


class KeepsStudent:
    """Mixin: remember the server model the method built."""

    def build_student(self, state, side):
        self.student = super().build_student(state, side)  # type: ignore[misc]
        return self.student


def test_coboosting_generator_loss_term_by_term(task: Task, monkeypatch) -> None:
    """Co-Boosting's generator loss (Dai et al., ICLR 2024, Eq. 4-5; the
    code's ``COBOOSTSynthesizer``: ``loss_oh`` and ``loss_adv =
    -kldiv(s_out, t_out, T=3)``) on a fixed batch, each term by hand: ``oh``
    the hard-sample-weighted CE of the *weighted ensemble* E_w (here
    data-size weights, so E_w is not the plain mean), ``adv`` the negative,
    unmasked ``T² · KL(E_w(x) || s(x))`` with the ensemble as the target and
    the (frozen, eval-mode) server model as the other side."""
    torch.manual_seed(0)
    x = task.x[:16].clone()
    y = torch.randint(0, task.run.num_classes, (16,))
    captured: dict[str, Any] = {}

    def stop(side, cfg, batch_size, gen, loss_fn):
        captured["terms"] = loss_fn(x, y)[1]
        raise _Captured

    monkeypatch.setattr(coboosting_module, "synthesize_batch", stop)
    cls = type("Spy", (KeepsStudent, METHODS.get("coboosting")), {})
    options = {
        **BUDGETS["coboosting"],
        "weighting": "data_size",
        "oh_weight": 1.3,
        "adv_weight": 0.9,
        "adv_temperature": 2.5,
        "hard_sample_power": 2.0,
    }
    method = task.method("coboosting", cls, **options)
    with pytest.raises(_Captured):
        task.serve(method)
    terms = captured["terms"]
    assert set(terms) == {"oh", "adv"}  # bn_weight = 0: no BN term, as the code

    n = torch.tensor([float(task.uploads[c].meta["num_samples"]) for c in task.ids])
    assert float(n.max() - n.min()) > 0  # the weighted ensemble is not the plain mean
    with torch.no_grad():
        t = (n[:, None, None] * torch.stack([m(x) for m in task.members])).sum(0) / n.sum()
        s = method.student.eval()(x)
        p_y = F.softmax(t, 1)[torch.arange(16), y]
        oh = ((1 - p_y) ** 2 * F.cross_entropy(t, y, reduction="none")).mean()
        adv = -_kl_t2(t, s, 2.5).mean()
        exchanged = -_kl_t2(s, t, 2.5).mean()
    assert abs(float(adv - exchanged)) > 1e-3  # the two directions differ on this batch
    assert terms["oh"] == pytest.approx(1.3 * float(oh), rel=1e-5)
    assert terms["adv"] == pytest.approx(0.9 * float(adv), rel=1e-5)


def test_coboosting_kd_compares_both_sides_on_the_perturbed_input(task: Task, monkeypatch) -> None:
    """Co-Boosting's KD (Dai et al., ICLR 2024, Eq. 8; the code's
    ``cb_kd_train``: ``images_adv = ods(images)``, then ``t_out =
    teacher(images_adv)``, ``s_out = student(images_adv)``): the student
    *and* the ensemble see the same perturbed batch ``x'``, and the loss is
    ``T² · KL(E_w(x') || s(x'))`` at the KD temperature. The perturbation
    is replaced by a fixed, visible one (its own direction is tested
    above), and its size and temperature are the configured ones."""
    captured: dict[str, Any] = {}

    class Stop(KeepsTeacher, KeepsStudent, METHODS.get("coboosting")):  # type: ignore[misc]
        def pool_distiller(self, side, teacher, student, loss_fn=None):
            captured["loss_fn"] = loss_fn
            raise _Captured

    delta = 0.5 * torch.sign(
        torch.randn(task.x[:8].shape, generator=torch.Generator().manual_seed(4))
    )
    ods_calls: list[tuple[float, float]] = []

    def fixed_ods(teacher, x, eps, temperature, rng):
        ods_calls.append((eps, temperature))
        return x + delta

    monkeypatch.setattr(coboosting_module, "ods_perturb", fixed_ods)
    options = {**BUDGETS["coboosting"], "ods_eps": 0.07, "ods_temperature": 2.0}
    options["distill"] = {**options["distill"], "temperature": 3.0}
    method = task.method("coboosting", Stop, **options)
    with pytest.raises(_Captured):
        task.serve(method)
    x = task.x[:8].clone()
    student = method.student.eval()
    d = type("D", (), {"student": student})()
    with torch.no_grad():
        got = captured["loss_fn"](d, None, x)
        xp = x + delta
        t = method.teacher(xp)
        want = _kl_t2(t, student(xp), 3.0).mean()
        clean_student = _kl_t2(t, student(x), 3.0).mean()
        clean_teacher = _kl_t2(method.teacher(x), student(xp), 3.0).mean()
    assert ods_calls == [(0.07, 2.0)]
    assert min(abs(float(want - clean_student)), abs(float(want - clean_teacher))) > 1e-3
    assert float(got) == pytest.approx(float(want), rel=1e-5)


def test_coboosting_weight_step_decays_by_wdc_each_epoch(task: Task, monkeypatch) -> None:
    """The ensemble-weight step of epoch e is ``mu · wdc^e`` (the code:
    ``mu * wdc ** epoch``), from the second epoch on, over ``wa_steps``
    passes of the pool in the KD batch size."""
    calls: list[tuple[float, int, int]] = []

    def spy(teacher, pool, step_size, *, passes, batch_size, generator):
        calls.append((step_size, passes, batch_size))
        return teacher.weights

    monkeypatch.setattr(coboosting_module, "boost_ensemble_weights", spy)
    options = {
        **BUDGETS["coboosting"],
        "epochs": 3,
        "generator": {"steps": 1},
        "mu": 0.04,
        "wdc": 0.5,
        "wa_steps": 2,
    }
    options["distill"] = {**options["distill"], "steps": 2}
    task.serve(task.method("coboosting", **options))
    assert calls == [(0.04 * 0.5, 2, 32), (0.04 * 0.25, 2, 32)]


# --------------------------------------------------------------------------- FedFTG
def test_fedftg_fine_tunes_the_clients_fedavg(task: Task, monkeypatch) -> None:
    """FedFTG fine-tunes the *global* model (Zhang et al., CVPR 2022, §3: the
    server model is the data-size-weighted FedAvg of the clients), not a fresh
    student: the model its server loop starts from is FedAvg's, and its result
    stays nearer FedAvg than the random initialisation is."""
    seen: list[dict[str, torch.Tensor]] = []
    cls = METHODS.get("fedftg")

    class Spy(cls):  # type: ignore[misc,valid-type]
        def server_train(self, side, teacher, student):
            seen.append({k: v.detach().clone() for k, v in student.state_dict().items()})
            return super().server_train(side, teacher, student)

    state = task.serve(task.method("fedftg", Spy, epochs=1, inner_steps=1))
    avg = fedavg(task)
    for k, v in avg.items():
        torch.testing.assert_close(seen[0][k], v)
    params = [k for k, v in avg.items() if v.is_floating_point() and "running" not in k]

    def dist(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
        return sum(float((a[k] - b[k]).norm()) for k in params)

    assert dist(state["server"], avg) < 0.2 * dist(task.state["init"], avg)


def test_fedftg_label_sampling_and_class_level_teacher_use_the_class_counts(
    task: Task, monkeypatch
) -> None:
    """FedFTG's customised label sampling and class-level ensemble (Zhang et
    al., CVPR 2022, §3.3-3.4): labels drawn in proportion to the *global*
    class counts ``n^y = Σ_k n_k^y``, and the teacher of a sample of class y
    the mixture of the clients' softmax weighted by ``α_k^y = n_k^y / n^y``."""
    counts = np.array([task.uploads[c].meta["class_counts"] for c in task.ids])
    seen: list[np.ndarray] = []
    real = fedftg_module.customised_labels

    def spy(total, class_counts, generator):
        seen.append(np.asarray(class_counts))
        return real(total, class_counts, generator)

    monkeypatch.setattr(fedftg_module, "customised_labels", spy)
    cls = type("Spy", (KeepsTeacher, METHODS.get("fedftg")), {})
    method = task.method("fedftg", cls, epochs=1, inner_steps=1)
    task.serve(method)
    assert np.array_equal(seen[0], counts.sum(0))
    alpha = counts / counts.sum(0, keepdims=True).clip(min=1)
    y = torch.arange(10)
    x = task.x[:10]
    with torch.no_grad():
        probs = torch.stack([F.softmax(m(x), -1) for m in task.members])  # M, B, K
        weights = torch.as_tensor(alpha[:, y.numpy()], dtype=torch.float32)  # M, B
        held = weights.sum(0) > 0
        expected = (weights[..., None] * probs).sum(0)
        got = method.teacher(x, y).exp()
    torch.testing.assert_close(got[held], expected[held], rtol=1e-4, atol=1e-6)


def test_fedftg_generator_mines_hard_samples(task: Task, monkeypatch) -> None:
    """FedFTG's hard sample mining (Zhang et al., CVPR 2022, Eq. 5: the
    generator *maximises* the l1 discrepancy between the server model and
    each client): with only that term, the discrepancy grows over the
    generator's steps (the server model is frozen meanwhile)."""
    values: list[float] = []
    real = fedftg_module.l1_discrepancy

    def spy(student_logits, teacher_logits, weight=None):
        out = real(student_logits, teacher_logits, weight)
        values.append(float(out.detach()))
        return out

    monkeypatch.setattr(fedftg_module, "l1_discrepancy", spy)
    method = task.method(
        "fedftg", epochs=1, cls_weight=0.0, dis_weight=0.0, generator={"steps": 8, "lr": 0.01}
    )
    task.serve(method)
    first = values[0 :: len(task.ids)]  # client 0's term at each generator step
    assert len(first) == 8 and first[-1] > 1.5 * first[0]


# --------------------------------------------------------------------------- FedDF / PriorKD
def test_feddf_distils_on_its_public_split(task: Task) -> None:
    """FedDF distils on unlabelled *public* data (Lin et al., NeurIPS 2020,
    Alg. 1): the transfer set is the named data set's chosen split, at the
    run's image shape; nothing of the clients' data."""
    from osfl.data.sources import load_data

    method = task.method("feddf", **BUDGETS["feddf"])
    side = type("Side", (), {"image_shape": task.run.image_shape})()
    got = method.transfer_set(side)
    want = load_data("digits", image_size=8, channels=1).test
    assert torch.equal(got.images, want.images)
    train = task.method("feddf", **{**BUDGETS["feddf"], "public_split": "train"})
    assert len(train.transfer_set(side)) != len(got)
