"""Registry-wide contract tests for osfl.models (every registered model) and
the CNN families' hyper-parameters (parameter counts worked out by hand /
matching the reference CIFAR implementations)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import osfl.models.registry as model_registry
from osfl.errors import ConfigError
from osfl.models import ACTIVATIONS, create_model, list_models, register_model
from osfl.registry import Registry
from support.smoke import small_model_kwargs

NUM_CLASSES = 7


def _input(model: nn.Module, name: str, batch: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if hasattr(model, "patch_embed"):
        h, w = model.patch_embed.img_size
    else:
        h = w = 32 if name in ("lenet5", "cnn_small") else 16
    return torch.randn(batch, 3, h, w, generator=g)


def _params(module: nn.Module) -> set[int]:
    return {id(p) for p in module.parameters()}


@pytest.mark.parametrize("name", list_models())
def test_model_contract(name: str) -> None:
    torch.manual_seed(0)
    model = create_model(name, num_classes=NUM_CLASSES, **small_model_kwargs(name))
    x = _input(model, name)

    # interface, in eval mode (deterministic)
    model.eval()
    with torch.no_grad():
        logits = model(x)
        feats = model.forward_features(x)
        assert logits.shape == (2, NUM_CLASSES)
        assert torch.isfinite(logits).all()
        assert feats.shape == (2, model.num_features)
        torch.testing.assert_close(model.forward_head(feats), logits)
        head = model.get_classifier()
        assert isinstance(head, nn.Linear) and head.bias is not None
        assert (head.in_features, head.out_features) == (model.num_features, NUM_CLASSES)
        torch.testing.assert_close(feats @ head.weight.T + head.bias, logits)
        fx = model.feature_extractor()
        torch.testing.assert_close(fx(x), feats)
    # the extractor shares the trunk's parameters (same objects) and leaves out the head
    assert _params(fx) <= _params(model)
    assert not _params(head) & _params(fx)
    assert _params(fx) | _params(head) == _params(model)

    # every parameter gets a finite, non-zero gradient
    model.train()
    loss = nn.functional.cross_entropy(model(x), torch.tensor([0, 1]))
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.requires_grad, pname
        assert p.grad is not None, f"{name}: {pname} got no gradient"
        assert torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, f"{name}: {pname} got a zero gradient"


def test_registry_names() -> None:
    names = set(list_models())
    expected = {
        "resnet18",
        "resnet50",
        "vgg16",
        "vgg16_bn",
        "lenet5",
        "cnn_small",
        "vit_tiny_patch16_224",
        "vit_small_patch16_224",
        "vit_base_patch16_224",
        "deit_tiny_patch16_224",
        "deit_small_patch16_224",
        "deit_base_patch16_224",
        "vit_tiny_patch4_32",
        "vit_small_patch4_32",
        "vit_tiny_patch2_16",
        "dinov2_small",
        "dinov2_base",
        "dinov2_large",
        "dinov2_small_reg",
        "dinov2_base_reg",
        "tv_resnet18",
        "tv_resnet50",
    }
    assert expected <= names
    assert list_models("resnet*") == ["resnet18", "resnet50"]
    assert all(n.startswith("vit_") for n in list_models("VIT_*"))
    assert list_models("nothing*") == []


@pytest.mark.parametrize(
    ("name", "params", "dim"),
    [
        # the reference CIFAR implementations' counts (kuangliu/pytorch-cifar) at 10 classes
        ("resnet18", 11_173_962, 512),
        ("resnet50", 23_520_842, 2048),
        ("vgg16_bn", 14_728_266, 512),
        ("vgg16", 14_728_266 - 2 * 4224, 512),  # minus 13 BN layers' weight+bias (2·4224)
        # 456 + 2416 + 48120 + 10164 + 850
        ("lenet5", 62_006, 84),
        # torchvision's resnet18 / resnet50 at their default 1000 classes
        ("tv_resnet18", 11_689_512, 512),
        ("tv_resnet50", 25_557_032, 2048),
    ],
)
def test_cnn_sizes_match_reference(name: str, params: int, dim: int) -> None:
    model = create_model(name, num_classes=1000 if name.startswith("tv_") else 10)
    assert sum(p.numel() for p in model.parameters()) == params
    assert model.num_features == dim


def test_cnn_small_is_small_and_handles_digit_sizes() -> None:
    model = create_model("cnn_small", num_classes=10, in_chans=1).eval()
    n = sum(p.numel() for p in model.parameters())
    assert 10_000 < n < 50_000
    for size in (8, 16, 28, 32):
        assert model(torch.rand(3, 1, size, size)).shape == (3, 10)
    plain = create_model("cnn_small", norm=False)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in plain.modules())


def test_imagenet_stem() -> None:
    """torchvision's stem: 7×7/2 conv and 3×3/2 max-pool, so 64 px reach layer1 at 16 px."""
    model = create_model("tv_resnet18", num_classes=3).eval()
    assert model.conv1.kernel_size == (7, 7) and model.conv1.stride == (2, 2)
    assert isinstance(model.maxpool, nn.MaxPool2d)
    assert "maxpool" in model.feature_extractor()._modules
    seen = {}

    def record(module: nn.Module, inputs: tuple, out: torch.Tensor) -> None:
        seen["layer1"] = out.shape

    model.layer1.register_forward_hook(record)
    assert model(torch.rand(1, 3, 64, 64)).shape == (1, 3)
    assert seen["layer1"] == (1, 64, 16, 16)
    assert not hasattr(create_model("resnet18"), "maxpool")
    with pytest.raises(ConfigError, match=r"unknown resnet stem 'deep'.*cifar, imagenet"):
        create_model("resnet18", stem="deep")


def test_vgg_and_resnet_accept_small_and_grey_inputs() -> None:
    for name in ("vgg16", "resnet18"):
        model = create_model(name, num_classes=4, in_chans=1).eval()
        assert model(torch.rand(2, 1, 8, 8)).shape == (2, 4)


def test_lenet_img_size() -> None:
    assert create_model("lenet5").features.fc1.in_features == 16 * 5 * 5
    m28 = create_model("lenet5", img_size=28, in_chans=1).eval()
    assert m28.features.fc1.in_features == 16 * 4 * 4
    assert m28(torch.rand(2, 1, 28, 28)).shape == (2, 10)
    with pytest.raises(ConfigError, match="img_size >= 16"):
        create_model("lenet5", img_size=12)  # the second 5x5 conv would see a 4x4 map
    with pytest.raises(ConfigError, match="at least 16 px"):
        create_model("lenet5")(torch.rand(1, 3, 12, 12))
    m16 = create_model("lenet5", img_size=16).eval()
    assert m16.features.fc1.in_features == 16 and m16(torch.rand(2, 3, 16, 16)).shape == (2, 10)


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "vgg16_bn", "lenet5", "cnn_small"])
def test_activation_option_changes_modules(name: str) -> None:
    default = create_model(name)
    assert any(isinstance(m, nn.ReLU) for m in default.modules())
    tanh = create_model(name, act="tanh")
    assert any(isinstance(m, nn.Tanh) for m in tanh.modules())
    assert not any(isinstance(m, nn.ReLU) for m in tanh.modules())
    # same parameters either way: the activation has none
    assert [k for k, _ in default.named_parameters()] == [k for k, _ in tanh.named_parameters()]


def test_activation_registry() -> None:
    assert {"relu", "tanh", "elu", "selu", "silu"} <= set(ACTIVATIONS.names())
    with pytest.raises(ConfigError, match=r"unknown activation 'swish2'.*relu"):
        create_model("cnn_small", act="swish2")


def test_bad_names_and_arguments_refused() -> None:
    with pytest.raises(ConfigError, match=r"unknown model 'resnet19'.*resnet18"):
        create_model("resnet19")
    with pytest.raises(ConfigError, match="unexpected keyword argument 'depthh'"):
        create_model("vit_tiny_patch4_32", depthh=3)
    for bad in (0, -3, True, 2.5):
        with pytest.raises(ConfigError, match="num_classes must be a positive integer"):
            create_model("cnn_small", num_classes=bad)
    with pytest.raises(ConfigError, match="in_chans"):
        create_model("resnet18", in_chans=0)


def test_duplicate_registration_refused() -> None:
    def resnet18(**kwargs):  # same name as the registered one
        return nn.Linear(1, 1)

    with pytest.raises(ValueError, match="duplicate model name 'resnet18'"):
        register_model(resnet18)
    with pytest.raises(ValueError, match="duplicate"):
        register_model("cnn_small")(resnet18)


def test_register_model_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_registry, "MODELS", Registry("model"))  # leave the real one alone

    @register_model
    def toy(num_classes: int = 3) -> nn.Module:
        return nn.Linear(2, num_classes)

    register_model("toy_named")(toy)
    assert model_registry.list_models() == ["toy", "toy_named"]
    assert create_model("TOY", num_classes=5).out_features == 5
    assert create_model("toy_named").out_features == 3


def test_reset_classifier() -> None:
    model = create_model("resnet18", num_classes=10)
    fc_before = model.get_classifier()
    model.reset_classifier(3)
    assert model.get_classifier() is not fc_before
    assert model.get_classifier().out_features == 3 and model.num_classes == 3
    assert model.eval()(torch.rand(2, 3, 8, 8)).shape == (2, 3)
