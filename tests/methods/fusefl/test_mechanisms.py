"""Mechanism tests of FuseFL (Tang et al., NeurIPS 2024): progressive
block-wise fusion. Its protocol runs step by step on the smoke task (digits at
8 px, three clients), calling the method's own parts: fused blocks stay
frozen in later steps, every client is fused progressively, and the
classifier fusion equals a hand computation."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from osfl.fl.context import ClientState
from osfl.methods.fusefl import method as fusefl_module
from osfl.methods.fusefl import modules as fusefl_modules
from support.smoke import client_ctx, smoke_job

# --------------------------------------------------------------------------- FuseFL
K = 3


@pytest.fixture(scope="module")
def fusefl() -> dict[str, Any]:
    """FuseFL's K = 3 rounds on three clients, step models recorded."""
    job = smoke_job("fusefl", f"method.fusefl.blocks={K}")
    method = job.method
    steps: list[dict[str, Any]] = []
    real = fusefl_module.train_client

    def spy(ctx, data, *, model, **kw):
        if isinstance(model, fusefl_module.StepModel):
            before = {k: v.detach().clone() for k, v in model.state_dict().items()}
            out = real(ctx, data, model=model, **kw)
            after = {k: v.detach().clone() for k, v in model.state_dict().items()}
            steps.append(
                {
                    "round": ctx.round,
                    "client": ctx.client_id,
                    "before": before,
                    "after": after,
                    "members": [b.members for b in model.prefix.blocks],
                }
            )
            return out
        return real(ctx, data, model=model, **kw)

    mp = pytest.MonkeyPatch()
    mp.setattr(fusefl_module, "train_client", spy)
    try:
        state = method.init_state()
        own = {c: ClientState() for c in range(3)}
        uploads_by_round = []
        own_after_round0: dict[int, dict[str, torch.Tensor]] = {}
        for r in range(K):
            b = method.broadcast(state, r)
            ups = {
                c: method.client_update(client_ctx(job, c, r, own[c]), b, job.clients.data(c))
                for c in range(3)
            }
            if r == 0:
                own_after_round0 = {c: dict(own[c].tensors) for c in range(3)}
            uploads_by_round.append(ups)
            state = method.aggregate(state, ups, r)
    finally:
        mp.undo()
    return {
        "job": job,
        "state": state,
        "steps": steps,
        "uploads": uploads_by_round,
        "own0": own_after_round0,
    }


def test_fusefl_fused_blocks_stay_frozen_in_later_steps(fusefl) -> None:
    """FuseFL's step k (Tang et al., NeurIPS 2024, §4 / Fig. 4): the fused
    blocks 0..k-1 (every client's, from the server) are frozen — parameters
    and BN statistics alike — while the new adaptor and the client's own
    later blocks train."""
    steps = fusefl["steps"]
    assert [(s["round"], s["client"]) for s in steps] == [(r, c) for r in (1, 2) for c in range(3)]
    for s in steps:
        prefix = [k for k in s["before"] if k.startswith("prefix.")]
        trainable = [k for k in s["before"] if k.startswith(("adaptor.", "own.", "head."))]
        assert prefix and trainable
        for k in prefix:
            assert torch.equal(s["before"][k], s["after"][k]), (s["round"], k)
        moved = [k for k in trainable if not torch.equal(s["before"][k], s["after"][k])]
        assert any(k.startswith("adaptor.") for k in moved)
        assert any(k.startswith("own.") for k in moved)


def test_fusefl_fuses_every_client_progressively(fusefl) -> None:
    """FuseFL's K rounds (Tang et al., NeurIPS 2024, Alg. 1): round k fuses
    block k of *every* client behind the fused blocks 0..k-1; the step model of
    round k holds exactly the server's fused blocks so far, each member's
    block as that member uploaded it; the uploaded block k is the one the
    client trained in step k (not its round-0 block), and the final model
    holds K fused blocks of all three members."""
    state, steps = fusefl["state"], fusefl["steps"]
    assert len(state["fused"]) == K and all(sorted(e) == [0, 1, 2] for e in state["fused"])
    for s in steps:
        k = s["round"]
        assert s["members"] == [[0, 1, 2]] * k
        for j in range(k):
            for i, c in enumerate([0, 1, 2]):
                sent = state["fused"][j][c]["block"]
                for name, v in sent.items():
                    assert torch.equal(s["after"][f"prefix.blocks.{j}.blocks.{i}.{name}"], v)
    for k in range(1, K):
        for c in range(3):
            block = fusefl["uploads"][k][c].tensors
            trained = state["fused"][k][c]["block"]
            for name, v in trained.items():
                assert torch.equal(block[f"block.{name}"], v)
            paths = fusefl["job"].method.split.blocks[k]
            first = paths[0].replace(".", "_")
            round0 = {
                n: v for n, v in fusefl["own0"][c].items() if n.startswith("own." + paths[0] + ".")
            }
            later = {n.split(".", 1)[1]: v for n, v in trained.items() if n.startswith(first + ".")}
            assert round0 and any(
                not torch.equal(v, later[n[len("own." + paths[0] + ".") :]])
                for n, v in round0.items()
            )
    pred = fusefl["job"].method.predictor(state)
    assert len(pred.trunk.blocks) == K and all(len(b.blocks) == 3 for b in pred.trunk.blocks)
    # the classifiers of the last round, averaged by data size (the code's ``avg``)
    n = torch.tensor([float(state["num_samples"][c]) for c in range(3)])
    heads = [state["heads"][c] for c in range(3)]
    (avg,) = pred.classifier.heads
    for name in ("weight", "bias"):
        want = sum(w * h[name] for w, h in zip(n / n.sum(), heads, strict=True))
        torch.testing.assert_close(getattr(avg, name).detach(), want)


def test_fusefl_classifier_fusion_by_hand() -> None:
    """FuseFL's fused classifier: ``average`` applies the data-size average of
    the members' classifiers to the members' mean feature (the code's
    ``fedexnn_classifer=avg``, with the mean in place of its sum); ``heads``
    averages each member's own classifier on its own feature."""
    heads = [torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]
    with torch.no_grad():
        heads[0].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
        heads[0].bias.copy_(torch.tensor([0.0, 1.0]))
        heads[1].weight.copy_(torch.tensor([[3.0, 0.0], [0.0, -1.0]]))
        heads[1].bias.copy_(torch.tensor([4.0, 1.0]))
    feats = [torch.tensor([[2.0, 4.0]]), torch.tensor([[6.0, 0.0]])]
    with torch.no_grad():
        avg = fusefl_modules.ClassifierFusion(heads, [0.25, 0.75], "average")(feats)
        own = fusefl_modules.ClassifierFusion(heads, [0.25, 0.75], "heads")(feats)
    # W = [[2.5, 0], [0, -0.5]], b = [3, 1]; mean feature (4, 2)
    torch.testing.assert_close(avg, torch.tensor([[13.0, 0.0]]))
    # head 0 on (2, 4): (2, 5); head 1 on (6, 0): (22, 1); mean (12, 3)
    torch.testing.assert_close(own, torch.tensor([[12.0, 3.0]]))
