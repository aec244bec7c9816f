"""The token-inversion attack on plain tensors: a hand-made adapter (a fixed
linear encoder, sequences in hand), a hand-made Observation and ImageSets —
no Method, no run, no simulator — and the attack package imports nothing
from the methods (any statement, any depth)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError, DataError
from osfl.fl.observation import Observation
from osfl.privacy import (
    CallableTokenEncoder,
    FixedTokens,
    ObservationError,
    TokenSource,
    run_reconstruction_attack,
)
from support.paths import ROOT

PRIVACY = ROOT / "src" / "osfl" / "privacy"
ATTACK = {"epochs": 40, "batch_size": 32, "lr": 5e-3, "width": 16, "max_targets": 10}
V, D = 2, 6


def images(n: int, seed: int) -> ImageSet:
    """``n`` 1x8x8 uint8 images mixing three fixed patterns (a 3-dim family a
    12-dim token can carry)."""
    g = torch.Generator().manual_seed(seed)
    basis = torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(99))
    w = torch.rand(n, 3, generator=g)
    x = torch.einsum("nk,kchw->nchw", w / w.sum(1, keepdim=True), basis)
    return ImageSet((x * 255).round().to(torch.uint8), torch.zeros(n, dtype=torch.int64), ("a",))


class LinearTokens:
    """A hand-made encoder: a fixed random projection of the pixels to (V, D)."""

    num_views, dim = V, D

    def __init__(self) -> None:
        self.w = torch.randn(64, V * D, generator=torch.Generator().manual_seed(7))

    def __call__(self, images: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
        return (images.float().flatten(1) / 255 @ self.w).reshape(-1, V, D)


class HandMade:
    """A hand-made adapter: the encoder above; the server holds the tokens of
    ``held`` (here: the client's own images, the worst case) plus noise."""

    def __init__(self, held: torch.Tensor, noise: float) -> None:
        self.encode = LinearTokens()
        self.held, self.noise = held, noise

    def synthetic(self, obs: Observation, generator: torch.Generator) -> torch.Tensor:
        t = self.encode(self.held)
        return t + self.noise * torch.randn(t.shape, generator=generator)


@pytest.fixture(scope="module")
def plain() -> dict:
    private, aux = images(24, seed=1), images(96, seed=2)
    obs = Observation(3, 0)  # ids only: nothing of a method
    source = HandMade(private.images, noise=0.0)
    res = run_reconstruction_attack(
        "token_inversion", obs, aux, source=source, private=private, **ATTACK
    )
    return {"private": private, "aux": aux, "obs": obs, "source": source, "res": res}


def test_the_attack_runs_on_plain_tensors(plain) -> None:
    res, aux = plain["res"], plain["aux"]
    assert isinstance(plain["source"], TokenSource)
    assert (res.num_targets, res.num_synthetic, res.info["client"]) == (10, 24, 3)
    assert res.info["method"] == ""
    assert res.images["real"].shape == res.images["synthetic"][:10].shape == (10, 1, 8, 8)
    # the decoder learned the family: far better than the mean auxiliary image
    from osfl.privacy.metrics import psnr

    originals = res.images["originals"]
    mean_img = (aux.images.float() / 255).mean(0, keepdim=True).expand_as(originals)
    assert res.psnr_real > float(psnr(mean_img, originals).mean()) + 5.0
    # the server holds every real token: each image's best synthetic match is
    # at least as good as its own reconstruction
    real = torch.tensor(res.info["psnr_real_per_image"])
    best = torch.tensor(res.info["psnr_synthetic_per_image"])
    assert bool((best >= real - 1e-3).all())


def test_noisier_sequences_leak_less(plain) -> None:
    noisy = HandMade(plain["private"].images, noise=3.0)
    res = run_reconstruction_attack(
        "token_inversion",
        plain["obs"],
        plain["aux"],
        source=noisy,
        private=plain["private"],
        **ATTACK,
    )
    assert res.psnr_real == pytest.approx(plain["res"].psnr_real)  # same decoder, same targets
    assert res.psnr_synthetic < plain["res"].psnr_synthetic - 1.0


def test_library_plain_adapters_match_the_hand_made_one(plain) -> None:
    """CallableTokenEncoder (an nn.Module encoder) + FixedTokens give the
    hand-made adapter's result."""
    w = plain["source"].encode.w

    class Proj(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x.float().flatten(1) / 255 @ w).reshape(-1, V, D)

    encode = CallableTokenEncoder(Proj(), V, D, batch_size=7)
    source = FixedTokens(encode, encode(plain["private"].images))
    res = run_reconstruction_attack(
        "token_inversion",
        plain["obs"],
        plain["aux"],
        source=source,
        private=plain["private"],
        **ATTACK,
    )
    assert res.psnr_real == pytest.approx(plain["res"].psnr_real, abs=1e-4)
    assert res.psnr_synthetic == pytest.approx(plain["res"].psnr_synthetic, abs=1e-4)


def test_bad_plain_inputs_are_refused(plain) -> None:
    obs, aux, private = plain["obs"], plain["aux"], plain["private"]
    encode = plain["source"].encode
    with pytest.raises(ConfigError, match="TokenSource"):
        run_reconstruction_attack("token_inversion", obs, aux, source=encode, private=private)
    with pytest.raises(ObservationError, match="synthetic sequences of shape"):
        run_reconstruction_attack(
            "token_inversion",
            obs,
            aux,
            source=FixedTokens(encode, torch.zeros(4, V, D + 1)),
            private=private,
        )
    wrong = CallableTokenEncoder(lambda x: torch.zeros(len(x), V, D + 1), V, D)
    with pytest.raises(DataError, match="expected"):
        wrong(private.images)
    with pytest.raises(ConfigError, match="num_views"):
        CallableTokenEncoder(lambda x: x, 0, D)


def imported_modules(path: Path) -> list[str]:
    """Every module an ``import`` statement in ``path`` names (any depth;
    relative imports resolved against the file's package)."""
    parts = ["osfl", *path.relative_to(PRIVACY.parent).with_suffix("").parts]
    package = parts if path.name == "__init__.py" else parts[:-1]
    if package[-1] == "__init__":
        package = package[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            out.append(".".join([*base, node.module] if node.module else base))
    return out


def test_privacy_imports_nothing_from_methods() -> None:
    """Module level, inside functions, under TYPE_CHECKING: no import of
    ``osfl.methods`` anywhere in ``osfl.privacy``."""
    found = [
        f"{path.relative_to(PRIVACY)}: {name}"
        for path in sorted(PRIVACY.rglob("*.py"))
        for name in imported_modules(path)
        if name == "osfl.methods" or name.startswith("osfl.methods.")
    ]
    assert not found, found
