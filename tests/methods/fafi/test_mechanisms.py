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
from osfl.config import load_config, method_config
from osfl.errors import UploadError
from osfl.fl.method import METHODS
from osfl.fl.runtime.server_log import server_warnings
from osfl.fl.seeds import derive_seed
from osfl.fl.upload import Upload, validate
from osfl.methods.clients import average_states
from osfl.methods.fafi import method as fafi_method_module
from osfl.methods.fafi.fusion import draw_noise
from osfl.methods.fafi.local import client_prototypes
from support.smoke import BASE, first_aggregation, smoke_config, smoke_context


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
    median fusion the coordinate-wise median over the clients whose class
    counts say they hold the class (here: class 1's two holders' mean)."""
    a = torch.tensor([[1.0, 0.0], [0.0, 0.0]])  # client 0 lacks class 1
    b = torch.tensor([[3.0, 2.0], [4.0, 4.0]])
    c = torch.tensor([[8.0, 4.0], [2.0, 0.0]])
    counts = ([3, 0], [2, 5], [1, 1])  # the uploads' meta.class_counts: client 0 lacks class 1
    clients = {
        i: {"prototypes": p, "class_counts": n}
        for i, (p, n) in enumerate(zip((a, b, c), counts, strict=True))
    }
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


@pytest.fixture(scope="module")
def median(fafi) -> dict[str, Any]:
    """The smoke task with ``fusion=median``: the same trained clients (no
    retraining), their uploads as round 0's aggregation receives them."""
    cfg = load_config(None, [*BASE, "method.fafi.augment=flip", "method.fafi.fusion=median"])
    job = assembly.build_job(cfg, "fafi", smoke_context(cfg))
    mp = pytest.MonkeyPatch()
    mp.setattr(
        fafi_method_module, "train_net", lambda a, cctx, n, d, arch: fafi["nets"][cctx.client_id]
    )
    try:
        state, uploads = first_aggregation(job)
    finally:
        mp.undo()
    return {"job": job, "method": job.method, "state": state, "uploads": uploads}


def _expected_median(protos: list[torch.Tensor], counts: list[list[int]]) -> torch.Tensor:
    """Per class: the median of the holders' rows (>= 3 holders), else their mean."""
    rows = []
    for k in range(protos[0].shape[0]):
        held = torch.stack([p[k] for p, n in zip(protos, counts, strict=True) if n[k] > 0])
        rows.append(held.median(0).values if len(held) >= 3 else held.mean(0))
    return torch.stack(rows)


def test_fafi_median_uploads_validated_class_counts_and_only_with_the_median(median, fafi) -> None:
    """With ``fusion=median`` each upload carries ``meta.class_counts`` (the
    client's label histogram, C non-negative integers summing to
    ``num_samples``), validated by the spec; the paper's protocol (every
    other fusion) sends none and refuses them."""
    method, job, state = median["method"], median["job"], median["state"]
    c_num = job.run.num_classes
    for c, up in median["uploads"].items():
        labels = job.clients.data(c).labels
        assert up.meta["class_counts"] == torch.bincount(labels, minlength=c_num).tolist()
        spec = method.upload_spec(state, 0, c)
        validate(up, spec, client=c)
        n = up.meta["num_samples"]
        bad_counts = {
            "negative": [-1, n + 1] + [0] * (c_num - 2),
            "length": [n] + [0] * c_num,
            "sum": [n + 1] + [0] * (c_num - 1),
            "float": [float(n)] + [0] * (c_num - 1),
        }
        for counts in bad_counts.values():
            with pytest.raises(UploadError, match="class_counts"):
                validate(Upload(up.tensors, {**up.meta, "class_counts": counts}), spec, client=c)
        plain = fafi["method"].upload_spec(fafi["state"], 0, c)
        assert "class_counts" not in fafi["uploads"][c].meta
        with pytest.raises(UploadError, match="class_counts"):
            validate(up, plain, client=c)


def test_fafi_median_counts_holders_of_learned_prototypes_by_class_counts(median) -> None:
    """Learned prototypes: every client's row of every class is non-zero
    (trained, as a negative, where it holds no data), so holders come from the
    class counts. A class with one or two holders gets their mean and is named
    in the warning the round keeps for the run's record; the rest get the
    median over their holders."""
    method, state, uploads = median["method"], median["state"], median["uploads"]
    ids = sorted(uploads)
    protos = [uploads[c].tensors["prototypes"] for c in ids]
    counts = [uploads[c].meta["class_counts"] for c in ids]
    assert all(bool((p.abs().sum(1) > 0).all()) for p in protos)  # non-zero says nothing
    holders = (torch.tensor(counts) > 0).sum(0).tolist()
    weak = [k for k, n in enumerate(holders) if 0 < n < 3]
    assert weak and 3 in holders  # the smoke split has both kinds of class
    with server_warnings() as said:
        agg = method.aggregate(state, uploads, 0)
    assert said == [
        f"fusion=median: classes {weak} have fewer than 3 holders, so their prototypes are "
        "the holders' mean and one hostile client can move them"
    ]
    got = method.global_prototypes(agg)
    torch.testing.assert_close(got, _expected_median(protos, counts), rtol=0, atol=1e-6)


def test_fafi_median_one_attacker_cannot_move_a_class_three_clients_hold(median) -> None:
    """An attacker that sends boosted, flipped learned prototypes and claims
    every class. With the three honest clients, every class two or three of
    them hold has at least three holders and keeps a row inside the honest
    rows' range (a median of three or four rows). With two honest clients, a
    class only one of them holds has two holders: the mean, which flips (the
    unprotected case the warning names)."""
    method, state, uploads = median["method"], median["state"], median["uploads"]
    num = method.run.num_classes
    hostile = Upload(
        {**uploads[0].tensors, "prototypes": -100.0 * uploads[0].tensors["prototypes"]},
        {"num_samples": 10 * num, "class_counts": [10] * num},
    )
    validate(hostile, method.upload_spec(state, 0, 0), client=0)  # a valid-looking poison
    for honest_ids in ([0, 1, 2], [0, 1]):
        honest = {c: uploads[c] for c in honest_ids}
        got = method.global_prototypes(method.aggregate(state, {**honest, 99: hostile}, 0))
        rows = torch.stack([up.tensors["prototypes"] for up in honest.values()])  # M×C×D
        held = torch.tensor([up.meta["class_counts"] for up in honest.values()]) > 0
        protected = [k for k in range(num) if int(held[:, k].sum()) >= 2]
        alone = [k for k in range(num) if int(held[:, k].sum()) == 1]
        assert protected and (alone or len(honest_ids) == 3)
        for k in protected:
            lo, hi = rows[:, k].min(0).values, rows[:, k].max(0).values
            assert bool(((got[k] >= lo - 1e-6) & (got[k] <= hi + 1e-6)).all()), k
        for k in alone:
            (m,) = [i for i in range(len(honest_ids)) if held[i, k]]
            assert float(F.cosine_similarity(got[k], rows[m, k], dim=0)) < -0.9, k
