"""Mechanism tests of EFTViT ("EFTViT: Efficient Federated Training of
Vision Transformers with Masked Images on Resource-Constrained Clients"):
masked patches never reach a client's local module, clients train only their
local module (and a head copy) while the server trains only the global
module and head, and median sampling uploads a class-balanced feature set.
The smoke task's 2-block ViT on 8-px digits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from osfl import assembly
from osfl.fl.context import ClientContext, ClientState
from osfl.methods.eftvit import EFTViTNet, MaskedTraining, num_kept
from osfl.methods.eftvit.upload import unpack_features
from osfl.models import create_model
from support.smoke import smoke_config, smoke_context


@pytest.fixture(scope="module")
def job() -> Any:
    cfg = smoke_config("eftvit")
    return assembly.build_job(cfg, "eftvit", smoke_context(cfg))


def client_ctx(job: Any, client: int, state: ClientState | None = None) -> ClientContext:
    return ClientContext(
        job.run, client, 0, torch.Generator().manual_seed(0), state or ClientState()
    )


def test_masked_patches_never_reach_the_local_module() -> None:
    """EFTViT's masked-image local training (§3.3, Eq. 1): a ratio r of each
    image's patches is dropped before the local module, so their pixels cannot
    change its output or the loss; every kept patch can, and each image gets
    its own ``int(N·(1-r))`` kept patches."""
    torch.manual_seed(0)
    vit = create_model(
        "vit_tiny_patch2_16", img_size=8, in_chans=1, depth=2, embed_dim=16, num_heads=2
    )
    net = EFTViTNet(vit, 1).train()
    x = torch.randn(6, 1, 8, 8)
    y = torch.arange(6) % 3
    keep_n = num_kept(16, 0.75)

    def run(images: torch.Tensor) -> tuple[torch.Tensor, MaskedTraining]:
        masked = MaskedTraining(keep_n, torch.Generator().manual_seed(1))
        return masked(net, images, y), masked

    loss, masked = run(x)
    keep = masked.kept[0]
    assert keep.shape == (6, 4) and len({tuple(r) for r in keep.tolist()}) > 1
    pixels = torch.zeros(6, 16, dtype=torch.bool)
    pixels.scatter_(1, keep, True)
    grid = pixels.view(6, 1, 4, 4).repeat_interleave(2, 2).repeat_interleave(2, 3)
    hidden = torch.where(grid, x, 100 * torch.randn_like(x))  # rewrite every dropped patch
    loss2, masked2 = run(hidden)
    torch.testing.assert_close(loss2, loss)
    torch.testing.assert_close(masked2.tokens[0], masked.tokens[0])
    seen = torch.where(grid, x + 1.0, x)  # change the kept patches only
    loss3, _ = run(seen)
    assert not torch.allclose(loss3, loss)


def test_clients_train_only_their_local_module_and_head(job) -> None:
    """EFTViT's client objective (Eq. 2): the local module (patch embedding,
    position embedding, blocks 0..M-1) and the head train; the broadcast
    global module is frozen, bit for bit."""
    method = job.method
    state = method.init_state()
    b = method.broadcast(state, 0)
    net, _ = method.train_local_module(client_ctx(job, 0), b, job.clients.data(0))
    start = dict(method.client_net(b.tensors, ClientState()).vit.named_parameters())
    after = dict(net.vit.named_parameters())
    roles = method.names()
    moved = {n for n in after if not torch.equal(after[n], start[n])}
    assert moved and moved <= set(roles.local) | set(roles.head)
    assert any(n.startswith("blocks.0.") for n in moved) and "head.weight" in moved
    assert "patch_embed.proj.weight" in moved
    frozen = set(roles.server) - set(roles.head)
    assert frozen and not moved & frozen


def test_server_trains_only_the_global_module_on_the_uploaded_features(job) -> None:
    """EFTViT's server (§3.5, Eq. 3-4): it holds and trains the global module
    (blocks M..L-1, the final norm) and the head on the uploaded patch
    features, fitting them better than before; the local modules are never
    on the server (its predictor keeps the pretrained one)."""
    method = job.method
    state = method.init_state()
    b = method.broadcast(state, 0)
    roles = method.names()
    uploads = {
        c: method.client_update(client_ctx(job, c), b, job.clients.data(c)) for c in range(3)
    }
    new = method.aggregate(state, uploads, 0)
    assert set(new.global_module) == set(roles.server)
    assert not set(roles.local) & set(new.global_module)
    changed = {
        k for k, v in new.global_module.items() if not torch.equal(v, state.global_module[k])
    }
    assert any(k.startswith("blocks.1.") for k in changed) and "head.weight" in changed
    feats = torch.cat([unpack_features(u.tensors)[0] for u in uploads.values()])
    labels = torch.cat([unpack_features(u.tensors)[1] for u in uploads.values()])

    def fit(global_module: dict[str, torch.Tensor]) -> float:
        vit = method.global_model(type(state)(global_module))
        _, top = vit.split(method.config.local_depth)
        with torch.no_grad():
            return float(F.cross_entropy(top(feats), labels))

    assert fit(new.global_module) < fit(state.global_module)
    base = method.base.state()
    server_model = dict(method.global_model(new).named_parameters())
    for n in roles.local:
        assert torch.equal(server_model[n], base[n])


def test_median_sampling_uploads_the_same_number_of_features_per_held_class(job) -> None:
    """EFTViT's median sampling (§3.4): the threshold m is the median of the
    client's class counts, and every class it holds uploads m patch
    features (majority classes downsampled, minority ones drawn from every
    epoch); an absent class uploads none."""
    method = job.method
    state = method.init_state()
    own = ClientState()
    data = job.clients.data(1)
    up = method.client_update(client_ctx(job, 1, own), method.broadcast(state, 0), data)
    counts = data.class_counts()
    m = int(np.floor(np.median(counts[counts > 0]) + 0.5))  # over the held classes only
    feats, labels = unpack_features(up.tensors)
    per_class = torch.bincount(labels, minlength=len(counts)).tolist()
    assert per_class == [m if n > 0 else 0 for n in counts]
    assert len(set(counts.tolist()) - {0}) > 1  # the client's classes are imbalanced
    assert feats.shape[1] == 1 + method.num_keep()  # the class token and the kept patches
    record = own.meta["sampling"][0]
    assert record["threshold"] == m and record["uploaded"] == per_class
