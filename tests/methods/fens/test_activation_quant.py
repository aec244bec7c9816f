"""benchmarks/fens_activation_quant.py: the authors' static quantisation
(default_qconfig: INT8 weights, 7-bit affine activations calibrated by
min/max) on an osfl model, and the in-process aggregator rounds it compares
the variants with (FENS's own client step, weighted mean, FedAdam)."""

from __future__ import annotations

import warnings

import torch
from torch.ao.nn import quantized as nnq

from osfl.fl.server_optim import server_step
from osfl.methods.fens import quantize_int8, quantized_keys
from osfl.models.cnn import SmallCNN
from support.scripts import load_script


def _module():
    return load_script("benchmarks/fens_activation_quant.py")


def test_static_int8_is_default_qconfig_calibrated_by_min_max():
    bench = _module()
    torch.manual_seed(0)
    model = SmallCNN(num_classes=4, width=4).eval()
    with torch.no_grad():  # non-trivial BatchNorm statistics
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
    calib = torch.randn(64, 3, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = bench.static_int8(model, calib)
    # the input's observer: quint8 with reduce_range, i.e. [0, 127] over [min(0, lo), max(0, hi)]
    lo, hi = min(0.0, float(calib.min())), max(0.0, float(calib.max()))
    assert torch.allclose(q.quant.scale, torch.tensor((hi - lo) / 127))
    convs = [m for m in q.modules() if isinstance(m, nnq.Conv2d)]
    assert len(convs) == 3 and isinstance(q.module.fc, nnq.Linear)
    # its weights are the per-tensor symmetric INT8 that fens uploads
    ours = quantize_int8(model.state_dict(), quantized_keys(model))
    assert torch.equal(q.module.fc.weight().int_repr(), ours["fc.weight"])
    assert torch.equal(q.module.features.conv1.weight().int_repr(), ours["features.conv1.weight"])
    # and its logits stay close to the float model's
    x = torch.randn(16, 3, 8, 8)
    with torch.no_grad():
        ref, got = model(x), q(x)
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert float((got - ref).abs().max()) < 0.1 * float(ref.abs().max()) + 0.05
    assert not torch.equal(got, ref)


class _Method:
    """The parts of FENS the aggregator loop reads."""

    def __init__(self):
        from osfl.methods.fens import FENS

        self.config = FENS.Config()

    def new_aggregator(self, members):
        from osfl.methods.fens.aggregator import LogitAggregator

        torch.manual_seed(0)
        return LogitAggregator(members, 3, 2 * members)


def test_fit_aggregator_is_fens_round_by_hand():
    """One round: each client's one SGD step (lr 1) from the server's
    aggregator on all its (< 128) held-out logits, the mean weighted by the
    samples seen, FedAdam's first step."""
    bench = _module()
    method = _Method()
    g = torch.Generator().manual_seed(0)
    logits = [torch.randn(n, 2, 3, generator=g) for n in (5, 15)]
    labels = [torch.randint(0, 3, (n,), generator=g) for n in (5, 15)]
    got = bench.fit_aggregator(method, logits, labels, rounds=1, seed=0).state_dict()
    x = {k: v.clone() for k, v in method.new_aggregator(2).state_dict().items()}
    states = []
    for z, y in zip(logits, labels, strict=True):
        agg = method.new_aggregator(2)
        agg.load_state_dict(x)
        torch.nn.functional.cross_entropy(agg(z), y).backward()
        states.append({k: (p - p.grad).detach() for k, p in agg.named_parameters()})
    mean = {k: 0.25 * states[0][k] + 0.75 * states[1][k] for k in x}
    want, _ = server_step(method.config.server_opt, x, mean, None)
    for k in want:
        torch.testing.assert_close(got[k], want[k])
