"""Device placement, tested without a GPU (issue #32): a tensor created on
the CPU (``torch.zeros(n)``, ``torch.tensor(list)``, ``torch.from_numpy``, a
CPU generator drawing for a GPU tensor) meeting a model and batches on the
GPU raises there, and hides on a CPU-only machine where every test runs.

**Method.** The issue names ``torch._subclasses.fake_tensor.FakeTensorMode``
with ``device="cuda"``; on the CPU build of torch that CI runs (2.13+cpu) it
cannot carry a training step: ``module.to("cuda")`` is refused ("PyTorch is
not linked with support for cuda devices") and the first autograd node
recorded on a fake CUDA tensor aborts the process (no CUDA device guard in
a CPU build). So these tests use ``tests/support/simulated_device.py``: torch's
privateuse1 device slot, registered as ``simgpu`` with torch's Python device
guard, whose tensors hold real CPU data; a dispatch mode checks every aten op
against CUDA's placement rules (all tensor arguments on one device, except
CPU scalars, CPU index tensors and copies) and a function mode CUDA's
generator rule. Every op runs for real, so ``.item()``, data-dependent
shapes, losses and accuracies all work: nothing is skipped for lack of
values. The numbers must equal the CPU run's bit for bit (uploads and
accuracy): the simulation moves no arithmetic. Off the CPU, training takes
the sync-free device path (issue #40: augmentations from a device generator,
``torch.where`` selections, masked means), so the CPU reference runs the same
path under :func:`osfl.data.transforms.emulate_device_path`; that the plain
CPU path keeps today's numbers is tested in ``tests/fl/test_sync_free.py`` and
by the README's numbers (``tests/docs/test_docs.py``). One kernel choice depends on
the device type: off the CPU, ``scaled_dot_product_attention`` runs its math
path rather than the fused CPU kernel (1e-7 apart, which EFTViT's smoke run
grows into 24 accuracy points over its rounds), so the CPU reference runs
under ``sdpa_kernel(SDPBackend.MATH)``.

**Covered here (fast):** every registered model's forward and backward
(:func:`osfl.models.list_models`); one ``train_local`` step with the
crop-flip augmentation drawing from the generator and the FedProx and
SCAFFOLD terms; and whole runs (clients, upload, server step, predictor,
evaluation) of one method per family: aggregation (``fedavg``), closed-form
heads (``fedcgs``, ``ghofl``), GMM statistics (``fedpft``), token encoding
with a generator step and server distillation (``falcon``), data-free
distillation with a generator (``dense``); a whole audited experiment
(``run_experiment`` with the llg+, rlu and zlg+ audits); the three
pretraining objectives (supervised, DINO, MAE). The slow test runs every
registered method's smoke run on the simulated device (all 32 pass; run
by hand before this commit, so no device bug was found in ``src``).

**Not covered** (the simulated device is not called ``cuda``): code that
branches on ``device.type == "cuda"`` takes its CPU path, i.e. AMP autocast
and the ``GradScaler`` (``fl/training.py``, EFTViT's server), the CUDA RNG
fork in ``fl/tensor_fit.py``, ``torch.cuda.*`` queries (provenance: tested by
monkeypatching in ``tests/fl/test_provenance.py``); CUDA streams, pinned memory
and asynchronous copies; kernels' own dtype support in bf16/fp16. The
checks are thread-local (torch's dispatch modes are): clients trained in a
thread pool (``parallel_clients > 1``) escape them, so these tests train
clients one at a time; the Flower runtimes are not run here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

import osfl.methods  # noqa: F401  (registers the methods)
from osfl import assembly
from osfl.config import load_config
from osfl.data.imageset import ImageSet
from osfl.data.transforms import build_transform, emulate_device_path
from osfl.fl.method import METHODS
from osfl.fl.objectives import ProximalTerm, ScaffoldCorrection
from osfl.fl.observers import Observer
from osfl.fl.runtime.simulation import SimulationRuntime
from osfl.fl.train_config import TrainConfig
from osfl.fl.training import train_local
from osfl.models import create_model, list_models
from support.simulated_device import DEVICE_TYPE, OnDevice, PlacementError, simulated_device
from support.smoke import BASE, one_torch_thread, small_model_kwargs, smoke_context  # noqa: F401  (an autouse fixture)
from support.tiny import TINY_DEVICE


def _on_device(t: torch.Tensor) -> bool:
    return t.device.type == DEVICE_TYPE


# --------------------------------------------------------------------------- the shim itself
def test_the_simulated_device_refuses_what_cuda_refuses() -> None:
    with simulated_device() as dev:
        w = torch.randn(3, 3).to(dev)
        assert isinstance(w, OnDevice) and _on_device(w @ w)
        with pytest.raises(PlacementError, match="cpu and simgpu"):
            w + torch.ones(3, 3)  # a CPU tensor meets a device one
        with pytest.raises(PlacementError, match="generator"):
            torch.rand(3, device=dev, generator=torch.Generator().manual_seed(0))
        with pytest.raises(TypeError, match="numpy"):
            w.numpy()
        with pytest.raises(PlacementError, match="cpu and simgpu"):
            torch.zeros(()).add_(w.sum())  # a CPU scalar is no destination for a device sum
        with pytest.raises(PlacementError, match="cpu and simgpu"):
            torch.ones(3, 3)[torch.tensor([0, 2]).to(dev)]  # device indices into a CPU tensor
        # what CUDA allows: CPU scalars, CPU indices, copies, a device generator
        assert _on_device(w * torch.tensor(2.0)) and _on_device(w[torch.tensor([0, 2])])
        assert _on_device(w.sum().add_(torch.tensor(2.0)))
        assert _on_device(torch.zeros(3, device=dev).copy_(torch.ones(3)))
        g = torch.Generator(device=dev).manual_seed(0)
        assert _on_device(torch.rand(3, device=dev, generator=g))
        assert w.sum().item() == pytest.approx(float(w.cpu().sum()))
        # module.to keeps its Parameter objects, as a move to CUDA does
        lin = nn.Linear(2, 2)
        weight = lin.weight
        lin.to(dev)
        assert lin.weight is weight and _on_device(weight)


# --------------------------------------------------------------------------- models


def _input_size(model: nn.Module, name: str) -> tuple[int, int]:
    if hasattr(model, "patch_embed"):
        return tuple(model.patch_embed.img_size)
    return (32, 32) if name in ("lenet5", "cnn_small") else (16, 16)


@pytest.mark.parametrize("name", list_models())
def test_every_model_runs_forward_and_backward_on_the_device(name: str) -> None:
    torch.manual_seed(0)
    model = create_model(name, num_classes=5, **small_model_kwargs(name))
    x = torch.randn(2, 3, *_input_size(model, name), generator=torch.Generator().manual_seed(0))
    with simulated_device() as dev:
        model.to(dev).train()
        logits = model(x.to(dev))
        loss = nn.functional.cross_entropy(logits, torch.tensor([0, 1]).to(dev))
        loss.backward()
        assert _on_device(logits) and _on_device(model.forward_features(x.to(dev)))
        for pname, p in model.named_parameters():
            assert p.grad is None or _on_device(p.grad), pname
        for bname, b in model.named_buffers():
            assert _on_device(b), bname


# --------------------------------------------------------------------------- local training
def test_a_train_local_step_stays_on_the_device() -> None:
    """One step with augmentation (random draws from the run's generator),
    FedProx and SCAFFOLD's correction: same loss as on the CPU."""
    g = torch.Generator().manual_seed(0)
    data = ImageSet(
        images=torch.randint(0, 256, (16, 3, 16, 16), dtype=torch.uint8, generator=g),
        labels=torch.arange(16) % 4,
        classes=("a", "b", "c", "d"),
    )
    cfg = TrainConfig(epochs=1, batch_size=8, lr=0.05, optimizer="sgdm", steps=2)
    tf = build_transform("crop_flip", image_size=16, mean=[0.5] * 3, std=[0.25] * 3)

    def train(device: torch.device) -> tuple[float, nn.Module]:
        torch.manual_seed(0)
        model = create_model("cnn_small", num_classes=4).to(device)
        anchor = {k: v.detach().clone() for k, v in model.named_parameters()}
        c = {k: torch.full_like(v, 0.01) for k, v in anchor.items()}
        terms = [ProximalTerm(anchor, mu=0.1), ScaffoldCorrection(c, None)]
        stats = train_local(model, data, cfg, transform=tf, device=device,
                            generator=torch.Generator().manual_seed(1), terms=terms)  # fmt: skip
        return stats.mean_loss, model

    with emulate_device_path():  # the device path, on the CPU's kernels
        cpu_loss, _ = train(torch.device("cpu"))
    with simulated_device() as dev:
        loss, model = train(dev)
        assert all(_on_device(p) for p in model.parameters())
    assert loss == cpu_loss


# --------------------------------------------------------------------------- method families
#: One method per family of server-side tensor work (module docstring).
FAMILIES = {
    "fedavg": (),  # weight aggregation
    "fedcgs": (),  # closed-form Gaussian head from client statistics
    "ghofl": (),  # NB / LDA / QDA heads and the learned heads' synthetic features
    "fedpft": (),  # per-class GMMs, the server's head on sampled features
    # token encoding, a generator per client, server distillation
    "falcon": tuple(
        f"method.falcon.{f}_fit.epochs=5" for f in ("generator", "classifier", "server")
    ),
    "dense": ("method.dense.epochs=1", "method.dense.distill.steps=5"),  # generator + distillation
}
FAST = ("train.epochs=1", "data.max_per_class=12")


class _FirstRound(Observer):
    """The round-0 uploads, on the CPU (what a GPU run's uploads become on the wire)."""

    def __init__(self) -> None:
        self.uploads: dict[tuple[int, str], torch.Tensor] = {}

    def on_upload(
        self, round: int, client: int, upload: Any, nbytes: int, truth: Any = None
    ) -> None:
        if round == 0:
            for key, t in upload.tensors.items():
                self.uploads[(client, key)] = t.detach().cpu().clone()


def _run(cfg: Any, name: str, device: torch.device | None) -> tuple[Any, _FirstRound]:
    ctx = smoke_context(cfg)
    if device is not None:
        ctx = dataclasses.replace(ctx, run=dataclasses.replace(ctx.run, device=device))
    first = _FirstRound()
    job = assembly.build_job(cfg, name, ctx)
    return SimulationRuntime().execute(job, observers=[first]), first


def _on_the_device_as_on_the_cpu(name: str, extra: tuple[str, ...]) -> None:
    card = METHODS.get(name).card
    cfg = load_config(None, [*BASE, *card.smoke, *extra, f"methods=[{name}]"])
    # off the CPU, torch's scaled_dot_product_attention takes its math path,
    # not the fused CPU kernel (1e-7 apart, grown to 24 accuracy points by
    # EFTViT's smoke run): the reference runs the same math path
    with sdpa_kernel(SDPBackend.MATH):
        with emulate_device_path():  # the device's sync-free path, on the CPU
            cpu, cpu_first = _run(cfg, name, None)
        with simulated_device() as dev:
            sim, sim_first = _run(cfg, name, dev)
    assert sim.refused == [] and sim.bytes_up == cpu.bytes_up
    assert sim_first.uploads.keys() == cpu_first.uploads.keys()
    for key, t in cpu_first.uploads.items():
        assert torch.equal(sim_first.uploads[key], t), (name, key)
    assert sim.metrics["global_test_accuracy"] == cpu.metrics["global_test_accuracy"], name


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_method_family_runs_on_the_device_as_on_the_cpu(name: str) -> None:
    _on_the_device_as_on_the_cpu(name, (*FAST, *FAMILIES[name]))


@pytest.mark.slow
@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_runs_on_the_device_as_on_the_cpu(name: str) -> None:
    _on_the_device_as_on_the_cpu(name, ())


# --------------------------------------------------------------------------- whole paths
def test_an_audited_experiment_runs_on_the_device(monkeypatch) -> None:
    """``run_experiment`` end to end (clients, evaluation, record) with the
    label-recovery audits reading the observations of the device's training;
    clients one at a time: the simulation's checks are thread-local."""
    from osfl.experiment import run_experiment

    tiny = [*TINY_DEVICE, "train.epochs=1", "cache_dir=null", "progress=false", "parallel_clients=1", "methods=[fedavg]", "audit=[llg+,rlu,zlg+]"]  # fmt: skip
    cfg = load_config(None, tiny)
    with emulate_device_path():
        (cpu,) = run_experiment(cfg)
    with simulated_device() as dev:
        monkeypatch.setattr(assembly, "resolve_device", lambda name: dev)
        (sim,) = run_experiment(cfg)
    assert sim["provenance"]["device"] == DEVICE_TYPE
    assert sim["global_test_accuracy"] == cpu["global_test_accuracy"]
    scores = lambda r: {a: (v["cAcc"], v.get("iAcc")) for a, v in r["audit"].items()}  # noqa: E731
    assert scores(sim) == scores(cpu) and set(scores(sim)) == {"llg+", "rlu", "zlg+"}


@pytest.mark.parametrize(
    "objective",
    [
        "supervised",
        pytest.param("dino", marks=pytest.mark.slow),
        pytest.param("mae", marks=pytest.mark.slow),
    ],
)
def test_pretraining_runs_on_the_device(objective: str, monkeypatch) -> None:
    import osfl.pretrain.train as pretrain_train
    from support.pretrain import digits_upstream, tiny_cfg

    cfg = tiny_cfg(f"objective={objective}", "train.epochs=1", "upstream.classes=[0,1,2,3,4]")
    upstream = digits_upstream(cfg)
    with simulated_device() as dev:
        monkeypatch.setattr(pretrain_train, "resolve_device", lambda name: dev)
        result = pretrain_train.pretrain(cfg, upstream)
    assert all(v == v for v in result.held_out.values())  # finite numbers came back
