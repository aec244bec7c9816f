"""What one FAFI client hands to the client-training cache, and the
prototypes it uploads (the mutants of ``osfl.methods.fafi.local`` the
training tests did not see; TESTING.md, "Mutation testing").

``train_client`` is replaced by a recorder, so nothing trains: each test
checks the model, recipe, objective and cache key of one branch of
:func:`~osfl.methods.fafi.local.train_net` (the plain model, plain CE
through a projection, SALT), where the net lives, and which prototype rows
a backward pass through the held-rows mask reaches.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from osfl.assembly import SeedContext
from osfl.data.imageset import ImageSet
from osfl.fl.context import ClientContext
from osfl.methods.fafi import FAFIConfig
from osfl.methods.fafi import local as local_module
from osfl.methods.fafi.architectures import Architectures
from osfl.methods.fafi.client import FAFINet, TwoViews
from osfl.methods.fafi.local import client_prototypes, train_net
from osfl.methods.fafi.salt import SaltLoss
from support.simulated_device import simulated_device
from support.tiny import seed_ctx

OTHER = "resnet18"  # an architecture other than the run's: its cache key is not None
PLAIN = SaltLoss(ssl_weight=0.0, proto_weight=0.0, ce_weight=1.0, sep_weight=0.0)


@pytest.fixture(scope="module")
def ctx(tiny_data) -> SeedContext:
    return seed_ctx(tiny_data)


@pytest.fixture
def trained(monkeypatch) -> list[dict[str, Any]]:
    """``train_client`` of the module, recording its call, where the model's
    parameters are, and the prototypes' gradient of ``prototypes.sum()``
    (through the hooks set on them)."""
    calls: list[dict[str, Any]] = []

    def recording(cctx: ClientContext, data: ImageSet, **kw: Any) -> None:
        model = kw["model"]
        call = {"cctx": cctx, "data": data, **kw}
        call["devices"] = {p.device for p in model.parameters()}
        if isinstance(model, FAFINet) and model.prototypes.device.type == "cpu":
            model.prototypes.sum().backward()  # through the held-rows hook, if one is set
            call["proto_grad"] = model.prototypes.grad
        elif isinstance(model, FAFINet):
            # on the simulated device an error raised in a backward hook aborts
            # the process (torch's Python device backend): call the hooks here
            grad = torch.ones_like(model.prototypes)
            for hook in (model.prototypes._backward_hooks or {}).values():
                grad = hook(grad)
            call["proto_grad"] = grad.cpu()
        calls.append(call)

    monkeypatch.setattr(local_module, "train_client", recording)
    return calls


def _arches(ctx: SeedContext, device: torch.device | None = None, **config: Any) -> Architectures:
    run = ctx.run if device is None else dataclasses.replace(ctx.run, device=device)
    kwargs = {"models": [OTHER], "model_kwargs": {OTHER: {"width": 4}}, **config}
    return Architectures(run, FAFIConfig(**kwargs))


def _data(labels: list[int]) -> ImageSet:
    images = torch.zeros(len(labels), 1, 8, 8, dtype=torch.uint8)  # the tiny run's digits
    return ImageSet(images, torch.tensor(labels), tuple(str(c) for c in range(10)))


def _train(arches: Architectures, data: ImageSet) -> tuple[ClientContext, FAFINet]:
    cctx = ClientContext(arches.run, 0, 0, torch.Generator())
    net = arches.build(OTHER)
    assert train_net(arches, cctx, net, data, OTHER) is net and not net.training
    return cctx, net


def test_plain_ce_without_a_projection_trains_the_plain_model_under_its_key(ctx, trained):
    arches = _arches(ctx, loss=PLAIN, proto_update="held")
    data = _data([0, 1, 1])
    cctx, net = _train(arches, data)
    [call] = trained
    assert net.head is None and call["cctx"] is cctx and call["data"] is data
    assert call["model"] is net.backbone and call["cfg"] is ctx.run.train
    assert call["extra_key"] == arches.cache_key(OTHER) is not None
    assert set(call) == {"cctx", "data", "model", "cfg", "extra_key", "devices"}


def test_plain_ce_through_a_projection_has_its_own_objective_and_no_mask(ctx, trained):
    arches = _arches(ctx, loss=PLAIN, feature_dim=6, proto_update="held")
    data = _data([0, 1, 1])
    _, net = _train(arches, data)
    [call] = trained
    assert call["model"] is net and call["cfg"] is ctx.run.train
    assert call["loss_fn"] is local_module._ce_loss and call["transform"] is None
    assert call["objective"] == "fafi-ce"
    assert call["extra_key"] == {"arch": arches.cache_key(OTHER), "feature_dim": 6}
    assert torch.equal(call["proto_grad"], torch.ones(10, 6))  # every row trains


@pytest.mark.parametrize("update", ["all", "held"])
def test_salt_keys_its_loss_and_masks_the_rows_of_absent_classes(ctx, trained, update: str):
    arches = _arches(ctx, feature_dim=6, proto_update=update)
    data = _data([3, 3, 0, 7])  # class 0 and class 7 once each
    _, net = _train(arches, data)
    [call] = trained
    assert call["model"] is net and call["cfg"] is ctx.run.train
    assert call["loss_fn"] is arches.config.loss and call["objective"] == "fafi"
    assert isinstance(call["transform"], TwoViews)
    extra = {"arch": arches.cache_key(OTHER), "feature_dim": 6, "salt": arches.config.loss.key()}
    held = torch.zeros(10, 1)
    held[[0, 3, 7]] = 1.0
    if update == "held":
        assert call["extra_key"] == extra | {"proto_update": "held"}
        assert torch.equal(call["proto_grad"], held.expand(10, 6))
    else:
        assert call["extra_key"] == extra
        assert torch.equal(call["proto_grad"], torch.ones(10, 6))
    net.prototypes.grad = None
    net.prototypes.sum().backward()  # the mask is gone after training
    assert torch.equal(net.prototypes.grad, torch.ones(10, 6))


@pytest.mark.parametrize("feature_dim", [None, 6])
def test_the_net_trains_where_the_client_runs_and_the_mask_is_made_there(
    ctx, trained, feature_dim: int | None
) -> None:
    with simulated_device() as dev:
        arches = _arches(ctx, dev, feature_dim=feature_dim, loss=PLAIN)
        _train(arches, _data([1, 2]))
        arches = _arches(ctx, dev, feature_dim=6, proto_update="held")
        _train(arches, _data([1, 2]))
    assert [c["devices"] for c in trained] == [{dev}, {dev}]
    held = torch.zeros(10, 1)
    held[[1, 2]] = 1.0
    assert torch.equal(trained[1]["proto_grad"], held.expand(10, 6))


def test_head_prototypes_are_the_ce_heads_rows(ctx) -> None:
    arches = _arches(ctx, feature_dim=6, prototypes="head", loss=PLAIN)
    net = arches.build(OTHER)
    got = client_prototypes(arches, net, _data([0]), torch.device("cpu"))
    assert torch.equal(got, net.head.weight.detach()) and got.shape == (10, 6)
    learned = dataclasses.replace(arches, config=FAFIConfig(prototypes="learned"))
    assert torch.equal(
        client_prototypes(learned, net, _data([0]), torch.device("cpu")), net.prototypes.detach()
    )
