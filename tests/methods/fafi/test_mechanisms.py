"""Mechanism tests of FAFI (Zeng et al., "Does One-shot Give the Best Shot?
Mitigating Model Inconsistency in One-shot Federated Learning", ICML 2025)
at the method level: what a client uploads (its extractor and prototypes),
how the server forms the global prototypes, and IFFI's weights (Eq. 8-10)
as the server's predictor computes them. The formulas themselves are worked
out by hand in test_fafi_fusion / test_fafi_losses; here the protocol is
checked to use them. One SALT training of the smoke task's three clients."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from osfl import assembly
from osfl.config import method_config
from osfl.fl.method import METHODS
from osfl.fl.seeds import derive_seed
from osfl.methods.clients import average_states
from osfl.methods.fafi import method as fafi_method_module
from osfl.methods.fafi.fusion import draw_noise
from osfl.methods.fafi.local import client_prototypes
from support.smoke import first_aggregation, smoke_config, smoke_context


@pytest.fixture(scope="module")
def fafi() -> dict[str, Any]:
    cfg = smoke_config("fafi")
    ctx = smoke_context(cfg)
    job = assembly.build_job(cfg, "fafi", ctx)
    nets: dict[int, Any] = {}
    real = fafi_method_module.train_net
    mp = pytest.MonkeyPatch()

    def spy(arches, cctx, net, data, arch):
        nets[cctx.client_id] = real(arches, cctx, net, data, arch)
        return nets[cctx.client_id]

    mp.setattr(fafi_method_module, "train_net", spy)
    try:
        state, uploads = first_aggregation(job)
    finally:
        mp.undo()
    method = job.method
    return {
        "job": job,
        "method": method,
        "uploads": uploads,
        "nets": nets,
        "state": method.aggregate(state, uploads, 0),
    }


def with_options(fafi: dict[str, Any], **options: Any) -> Any:
    cls = METHODS.get("fafi")
    return cls(method_config(cls, {"augment": "flip", **options}), fafi["job"].run)


def test_fafi_client_uploads_its_extractor_and_its_prototypes(fafi) -> None:
    """FAFI's upload (Alg. 1): the trained extractor and the C×D prototypes,
    which are the learned ones of L_proto (Eq. 5) by default, and with
    ``prototypes=class_mean`` the per-class means of the client's
    L2-normalised features (zero rows for the classes it lacks)."""
    job, run = fafi["job"], fafi["job"].run
    for c, up in fafi["uploads"].items():
        net = fafi["nets"][c]
        assert fafi["method"].config.prototype_kind == "learned"
        assert torch.equal(up.tensors["prototypes"], net.prototypes.detach().float())
        for k, v in net.extractor().state_dict().items():
            assert torch.equal(up.tensors[f"extractor.{k}"], v)
        data = job.clients.data(c)
        means = with_options(fafi, prototypes="class_mean")
        got = client_prototypes(means.arches, net, data, torch.device("cpu"))
        with torch.no_grad():
            f = F.normalize(net.features(run.eval_transform(data.images)), dim=1)
        for k in range(run.num_classes):
            held = data.labels == k
            want = f[held].mean(0) if bool(held.any()) else torch.zeros(f.shape[1])
            torch.testing.assert_close(got[k], want, rtol=1e-4, atol=1e-6)


def test_fafi_server_prototypes_mean_over_clients_holders_or_median(fafi) -> None:
    """The server's global prototypes (Alg. 1 l. 10: ``P_g = 1/M Σ_m P_m``): the
    plain mean of the uploads; with class-mean prototypes the mean over the
    clients that hold the class (a zero row is absence, not a vote); with the
    median fusion the coordinate-wise median over those clients."""
    a = torch.tensor([[1.0, 0.0], [0.0, 0.0]])  # client 0 lacks class 1
    b = torch.tensor([[3.0, 2.0], [4.0, 4.0]])
    c = torch.tensor([[8.0, 4.0], [2.0, 0.0]])
    clients = {i: {"prototypes": p} for i, p in enumerate((a, b, c))}
    cases = {
        "mean": ({}, [[4.0, 2.0], [2.0, 4.0 / 3]]),
        "class_mean": ({"prototypes": "class_mean"}, [[4.0, 2.0], [3.0, 2.0]]),
        "median": ({"fusion": "median"}, [[3.0, 2.0], [3.0, 2.0]]),
    }
    for options, want in cases.values():
        got = with_options(fafi, **options).global_prototypes({"clients": clients})
        torch.testing.assert_close(got, torch.tensor(want))


def test_fafi_iffi_weights_are_one_minus_the_cosine_to_the_noise_feature(fafi) -> None:
    """IFFI at the server (Eq. 8-10): client m's weight for sample x is
    ``1 - cos(F_m(x), F_m(ε))`` with ε ~ N(0, 1) drawn from the run's seed,
    the fused feature the weight-normalised mean of the clients' features,
    and the scores its cosines to the global prototypes."""
    method, state, run = fafi["method"], fafi["state"], fafi["job"].run
    pred = method.predictor(state).eval()
    x = run.eval_transform(fafi["job"].clients.data(0).images[:12])
    with torch.no_grad():
        scores = pred(x)
        extractors = [method.extractor_of(state, c) for c in sorted(state["clients"])]
        feats = torch.stack([e(x) for e in extractors])  # M×B×D
        noise = draw_noise(tuple(x.shape[1:]), samples=1, seed=derive_seed(run.seed, "fafi-noise"))
        noise_feats = torch.stack([e(noise).mean(0) for e in extractors])  # M×D
    alpha = 1 - F.cosine_similarity(feats, noise_feats[:, None, :], dim=-1)
    torch.testing.assert_close(pred.last_weights, alpha, rtol=1e-4, atol=1e-5)
    fused = (alpha[..., None] * feats).sum(0) / alpha.sum(0)[:, None]
    with torch.no_grad():
        torch.testing.assert_close(pred.fused_features(x), fused, rtol=1e-4, atol=1e-5)
    protos = torch.stack([state["clients"][c]["prototypes"] for c in state["clients"]]).mean(0)
    want = F.normalize(fused, dim=1) @ F.normalize(protos, dim=1).T
    torch.testing.assert_close(scores, want, rtol=1e-4, atol=1e-5)


def test_fafi_parameter_fusion_averages_the_extractors_by_data_size(fafi) -> None:
    """The ``params`` ablation (Table 3's parameter averaging): one extractor,
    the data-size-weighted FedAvg of the clients' extractors."""
    state = fafi["state"]
    ids = sorted(state["clients"])
    pred = with_options(fafi, fusion="params").predictor(state)
    (extractor,) = pred.extractors
    want = average_states(
        [state["clients"][c]["extractor"] for c in ids],
        [state["clients"][c]["num_samples"] for c in ids],
    )
    for k, v in extractor.state_dict().items():
        torch.testing.assert_close(v, want[k])
