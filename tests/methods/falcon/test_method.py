"""FALCON's parts: the generator variants (shapes, masks, NLL, two-step
sampling), the attention-pooling classifier, the distillation loss, the upload
choice, bad uploads, a single-class client and the report."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from osfl.assembly import SeedContext
from osfl.config import method_config
from osfl.data.federation import Federation
from osfl.errors import ConfigError, UploadError
from osfl.fl.context import ClientContext
from osfl.fl.method import give_validation
from osfl.fl.runtime.simulation import run_simulation
from osfl.fl.upload import Upload, validate
from osfl.methods.falcon import (
    FALCON,
    AttentionPoolClassifier,
    ClassifierConfig,
    GeneratorConfig,
    SequenceGenerator,
    distillation_loss,
    pick_smaller,
    synthetic_counts,
    teacher_probs,
)
from osfl.methods.falcon import method as falcon_method
from osfl.methods.falcon.generator import sample_gmm
from osfl.methods.falcon.upload import candidate_sizes, choose_form, sequence_key
from osfl.methods.frozen import FitConfig, fit
from support.tiny import FAST_FALCON, falcon, seed_ctx

D, V, C = 6, 5, 3
SMALL = GeneratorConfig(depth=2, width=16, heads=2, components=2)


def generator(variant: str, length: int = V, cfg: GeneratorConfig = SMALL) -> SequenceGenerator:
    torch.manual_seed(0)
    return SequenceGenerator(D, length, C, cfg, variant)


# --------------------------------------------------------------------------- generator
def test_tokens_are_standardised_per_position_and_dimension() -> None:
    """The global token s^(0) and the region tokens have their own statistics:
    each (position, dimension) gets its own mean and std, so every position of
    the standardised training tokens has mean 0 and std 1 (one statistic
    shared by the positions would shift each token's mixture by a
    position-dependent constant), and unstandardise undoes it exactly."""
    g = generator("mar")
    torch.manual_seed(1)
    offset = torch.arange(V, dtype=torch.float32)[None, :, None] * 10.0  # position-dependent
    scale = torch.linspace(0.5, 3.0, V)[None, :, None]
    tokens = torch.randn(64, V, D) * scale + offset
    g.set_token_stats(tokens)
    z = g.standardise(tokens)
    torch.testing.assert_close(z.mean(0), torch.zeros(V, D), atol=1e-5, rtol=0)
    torch.testing.assert_close(z.std(0, unbiased=False), torch.ones(V, D), atol=1e-5, rtol=0)
    torch.testing.assert_close(g.unstandardise(z), tokens, atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", ["mar", "ar", "nar"])
def test_generator_shapes_and_finite_values(variant: str) -> None:
    g = generator(variant)
    y = torch.tensor([0, 1, 2, 1])
    s = torch.randn(4, V, D) * 5 + 3
    with torch.no_grad():
        logit_pi, mu, logvar = g.params(y, s)
    assert logit_pi.shape == (4, V, 2) and mu.shape == logvar.shape == (4, V, 2, D)
    assert float(logvar.min()) >= SMALL.logvar_min and float(logvar.max()) <= SMALL.logvar_max
    nll = g.nll(y, s)
    assert nll.shape == (4,) and bool(torch.isfinite(nll).all())
    out = g.sample(y, torch.Generator().manual_seed(0))
    assert out.shape == (4, V, D) and out.dtype == torch.float32
    assert bool(torch.isfinite(out).all())
    one = generator(variant, length=1)  # w/o HSE: a single token
    assert one.sample(y, torch.Generator()).shape == (4, 1, D)
    assert bool(torch.isfinite(one.nll(y, s[:, :1])).all())


def test_mar_mask_is_block_causal_and_regions_see_no_other_region() -> None:
    g = generator("mar")
    m = g.attn_mask  # positions: class, s0, regions 1..4
    assert m.shape == (V + 1, V + 1)
    assert m[0].tolist() == [True] + [False] * V  # class sees itself only
    assert m[1].tolist() == [True, True] + [False] * (V - 1)
    for i in range(2, V + 1):
        seen = [j for j in range(V + 1) if m[i, j]]
        assert seen == [0, 1, i], f"region position {i} sees {seen}"
    # the softmax weights put exactly zero on the masked entries
    with torch.no_grad():
        x = g.layout.inputs(g, torch.tensor([0, 1]), torch.randn(2, V, D)) + g.pos
    with torch.no_grad():
        w = g.blocks[0].attn.attention_weights(g.blocks[0].norm1(x), g.attn_mask)
    assert float(w[..., 2:, 2:].masked_select(~torch.eye(V - 1, dtype=torch.bool)).abs().max()) == 0


def _param_change(
    g: SequenceGenerator, y: torch.Tensor, s: torch.Tensor, s2: torch.Tensor
) -> torch.Tensor:
    """Which token positions' GMM parameters move when s becomes s2 (V,)."""
    with torch.no_grad():
        a, b = g.params(y, s), g.params(y, s2)
    return torch.stack(
        [(p - q).abs().flatten(2).amax(-1).amax(0) for p, q in zip(a, b, strict=True)]
    ).amax(0)


def test_dependencies_of_each_variant() -> None:
    y = torch.tensor([0, 2])
    s = torch.randn(2, V, D)
    s0 = s.clone()
    s0[:, 0] += 3.0 * torch.randn(D)
    s3 = s.clone()
    s3[:, 3] += 3.0 * torch.randn(D)
    mar, ar, nar = generator("mar"), generator("ar"), generator("nar")
    # M-AR: p(s0|y) ignores everything; the regions depend on s0 only
    ch = _param_change(mar, y, s, s0)
    assert ch[0] == 0 and bool((ch[1:] > 1e-4).all())
    assert float(_param_change(mar, y, s, s3).max()) == 0.0
    # AR: token t depends on the tokens before it, never on itself or later ones
    ch = _param_change(ar, y, s, s3)
    assert bool((ch[:4] == 0).all()) and float(ch[4]) > 1e-4
    # NAR: every position depends on y only
    assert float(_param_change(nar, y, s, s0).max()) == 0.0
    # a region query's parameters never reach another region's output (M-AR)
    with torch.no_grad():
        before = mar.params(y, s)[1]
        mar.queries[3].add_(torch.randn(16))  # region 3's query
        after = mar.params(y, s)[1]
    moved = (before - after).abs().flatten(2).amax(-1).amax(0)
    assert float(moved[3]) > 1e-4 and float(moved[[0, 1, 2, 4]].max()) == 0.0


def test_nll_decreases_on_a_toy_set() -> None:
    torch.manual_seed(1)
    y = torch.randint(0, C, (128,))
    s = torch.randn(128, V, D) * 0.3 + y[:, None, None].float()
    g = generator("mar", cfg=GeneratorConfig(depth=1, width=16, heads=2, components=2))
    g.set_token_stats(s)
    with torch.no_grad():
        before = float(g.nll(y, s).mean())
    losses = fit(
        g,
        [s, y],
        lambda m, a, b: m.nll(b, a).mean(),
        FitConfig(epochs=20, batch_size=64, optimizer="adamw", lr=5e-3),
        generator=torch.Generator().manual_seed(0),
    )
    assert losses[-1] < losses[0] - 0.5 * V * D
    with torch.no_grad():
        assert float(g.nll(y, s).mean()) < before - 0.5 * V * D


def test_generator_loss_is_the_nll_averaged_over_positions_by_hand(tiny, monkeypatch) -> None:
    """The generator's training loss is the per-token NLL averaged over
    samples *and* positions: the authors' ``MDNGenerator.nll_loss``
    (``-log_mix.mean()`` over (B, L)), i.e. Eq. 5 / V. One component N(0, I)
    at every position and token s[b, t] = (t + b)·1 in D = 6 dimensions: a
    token's NLL is ½(6 (t + b)² + 6 log 2π); over b ∈ {0, 1}, t ∈ 0..4 the
    squares average 8.5, so the loss is ½·6·8.5 + 3 log 2π, and the sum over
    positions (the per-sample NLL) is V = 5 times that. The method trains
    with this loss, so the authors' clip of 2.0 sees their gradient scale."""
    g = generator("mar")
    zeros = torch.zeros(2, V, 1, D)
    monkeypatch.setattr(g, "params", lambda y, s: (zeros[..., 0, :1], zeros, zeros))
    y = torch.tensor([0, 1])
    s = (torch.arange(V)[None, :] + torch.arange(2)[:, None]).float()[..., None].expand(2, V, D)
    want = 0.5 * 6 * 8.5 + 3 * math.log(2 * math.pi)
    torch.testing.assert_close(g.loss(y, s), torch.tensor(want), rtol=1e-6, atol=0)
    torch.testing.assert_close(g.nll(y, s).mean(), torch.tensor(V * want), rtol=1e-6, atol=0)
    seen = []
    real_fit = falcon_method.fit
    monkeypatch.setattr(
        falcon_method, "fit", lambda *a, **k: seen.append(a[2]) or real_fit(*a, **k)
    )
    ctx = seed_ctx(tiny)
    m = falcon(ctx)
    tokens, labels = torch.randn(8, m.sequence_length(), m.token_dim()), torch.arange(8) % C
    trained = m.train_generator(ClientContext(ctx.run, 0, 0, torch.Generator()), tokens, labels, {})
    (loss_fn,) = seen
    with torch.no_grad():
        torch.testing.assert_close(loss_fn(trained, tokens, labels), trained.loss(labels, tokens))
        v = m.sequence_length()
        torch.testing.assert_close(
            v * loss_fn(trained, tokens, labels), trained.nll(labels, tokens).mean()
        )


def test_mdn_head_splits_its_output_as_pi_then_means_then_log_variances() -> None:
    """The head's one linear output is [logit π (K) | μ (K·D) | log σ² (K·D)],
    and the split equals the three slices it replaced, gradients included."""
    g = generator("mar")
    h = torch.randn(4, 16, requires_grad=True)
    logit_pi, mu, logvar = g.head(h)
    out = g.head.proj(h)
    k = SMALL.components
    ref = (
        out[..., :k],
        out[..., k : k + k * D].unflatten(-1, (k, D)),
        out[..., k + k * D :].unflatten(-1, (k, D)).clamp(SMALL.logvar_min, SMALL.logvar_max),
    )
    for got, want in zip((logit_pi, mu, logvar), ref, strict=True):
        assert torch.equal(got, want)
    w = [torch.randn_like(t) for t in ref]

    def grad(parts: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return torch.autograd.grad(sum((a * b).sum() for a, b in zip(parts, w, strict=True)), h)[0]

    assert torch.equal(grad((logit_pi, mu, logvar)), grad(ref))


def test_bfloat16_autocast_runs_the_matmuls_in_bfloat16_at_the_same_loss_curve() -> None:
    """``FitConfig.amp=true`` (bfloat16): the generator's linear layers compute in
    bfloat16 on a CPU, the NLL stays float32, and the loss curve follows the
    float32 one (toy set, 20 epochs: within 1 % of the total drop)."""
    torch.manual_seed(1)
    y = torch.randint(0, C, (128,))
    s = torch.randn(128, V, D) * 0.3 + y[:, None, None].float()
    seen: list[torch.dtype] = []
    curves = {}
    for cast, amp in (("none", False), ("bfloat16", True)):
        g = generator("mar", cfg=GeneratorConfig(depth=1, width=16, heads=2, components=2))
        g.set_token_stats(s)
        hook = g.head.proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        curves[cast] = fit(
            g,
            [s, y],
            lambda m, a, b: m.nll(b, a).mean(),
            FitConfig(epochs=20, batch_size=64, optimizer="adamw", lr=5e-3, amp=amp),
            generator=torch.Generator().manual_seed(0),
        )
        hook.remove()
    assert set(seen) == {torch.float32, torch.bfloat16}
    f32, b16 = np.array(curves["none"]), np.array(curves["bfloat16"])
    assert not np.array_equal(f32, b16)  # the autocast did change the arithmetic
    assert np.abs(f32 - b16).max() < 0.01 * (f32[0] - f32[-1])
    with pytest.raises(TypeError, match="autocast"):  # the old key, renamed amp
        FitConfig(autocast="float16")  # type: ignore[call-arg]
    with pytest.raises(
        ConfigError,
        match=r"^method.falcon.generator_fit.autocast was renamed "
        r"method.falcon.generator_fit.amp: write method.falcon.generator_fit.amp=true",
    ):
        method_config(FALCON, {"generator_fit": {"autocast": "bfloat16"}})


def test_the_first_pass_computes_only_what_it_reads() -> None:
    """M-AR's step 1 reads the class position alone, which attends only to
    itself: its output from the class token alone equals the full sequence's
    (so the sampler's cost is the authors' generate_full_proxy's: one position,
    then the whole sequence), and the samples are drawn from the same law."""
    torch.manual_seed(0)
    g = generator("mar", cfg=GeneratorConfig(depth=2, width=32, heads=2, components=3)).eval()
    y = torch.arange(4) % 2
    full = g.hidden(g.layout.inputs(g, y, None))[:, 0]
    alone = g.hidden(g.class_embed(y).unsqueeze(1))[:, 0]
    assert torch.allclose(alone, full, atol=1e-6)
    with FlopCounterMode(display=False) as counter:
        g.sample(y, torch.Generator().manual_seed(1))
    one_position = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter:
        g.hidden(g.layout.inputs(g, y, None))
    assert one_position < 2 * counter.get_total_flops()  # < two full passes


def test_two_step_sampling_uses_one_s0_per_sequence() -> None:
    """Regions copy s0 in the toy data; samples must do the same, and the s0
    fed to the second pass is the s0 that is returned."""
    torch.manual_seed(2)
    n = 256
    y = torch.zeros(n, dtype=torch.int64)
    s0 = torch.where(torch.rand(n, 1) < 0.5, -4.0, 4.0) * torch.ones(n, D)
    s = (s0[:, None] + 0.05 * torch.randn(n, V, D)).contiguous()
    g = generator("mar", cfg=GeneratorConfig(depth=1, width=32, heads=2, components=2))
    g.set_token_stats(s)
    fit(
        g,
        [s, y],
        lambda m, a, b: m.nll(b, a).mean(),
        FitConfig(epochs=30, batch_size=128, optimizer="adamw", lr=5e-3),
        generator=torch.Generator().manual_seed(0),
    )
    seen: list[torch.Tensor] = []
    hook = g.in_proj.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].detach()))
    out = g.sample(torch.zeros(64, dtype=torch.int64), torch.Generator().manual_seed(5))
    hook.remove()
    assert len(seen) == 1  # pass 1 runs the class token alone; pass 2 feeds the drawn s0
    assert torch.allclose(seen[0][:, 0], g.standardise(out)[:, 0], atol=1e-5)
    sign0 = out[:, 0].mean(-1).sign()
    # regions follow their own s0 (a re-drawn s0 would agree half of the time)
    agree = (out[:, 1:].mean(-1).sign() == sign0[:, None]).float().mean()
    assert float(agree) > 0.9
    assert 5 < int((sign0 > 0).sum()) < 59  # both modes are drawn


def test_ar_sampling_is_token_by_token() -> None:
    g = generator("ar")
    calls: list[int] = []
    hook = g.norm.register_forward_hook(lambda *a: calls.append(1))
    g.sample(torch.tensor([0, 1]), torch.Generator().manual_seed(0))
    hook.remove()
    assert len(calls) == V
    with pytest.raises(ConfigError, match="generator variant"):
        SequenceGenerator(D, V, C, SMALL, "diffusion")
    with pytest.raises(ConfigError, match="not divisible"):
        SequenceGenerator(D, V, C, GeneratorConfig(heads=4), "mar")  # width = D = 6


# --------------------------------------------------------------------------- classifier
def test_attention_pooling_follows_eqs_6_to_8() -> None:
    torch.manual_seed(0)
    clf = AttentionPoolClassifier(D, C, ClassifierConfig(mlp_ratio=0, residual_query=False))
    s = torch.randn(4, V, D)
    k, v = s @ clf.key.weight.T, s @ clf.value.weight.T
    alpha = torch.softmax(k @ clf.query / D**0.5, dim=-1)
    assert torch.allclose(clf.attention(s), alpha)
    assert torch.allclose(alpha.sum(-1), torch.ones(4))
    assert torch.allclose(clf.pool(s), (alpha[..., None] * v).sum(1), atol=1e-6)
    assert torch.allclose(clf(s), clf.head(clf.pool(s)), atol=1e-6)
    perm = s[:, torch.randperm(V)]
    assert torch.allclose(clf(perm), clf(s), atol=1e-5)  # a pooled set: order-free
    paper = AttentionPoolClassifier(768, 10, ClassifierConfig())
    n = sum(p.numel() for p in paper.parameters())
    assert 5.8e6 < n < 6.0e6  # the code's ~5.9 M-parameter design (paper: ~22.5 MB)
    res = AttentionPoolClassifier(D, C, ClassifierConfig(mlp_ratio=0))
    assert torch.allclose(
        res.pool(s) - res.query, (res.attention(s)[..., None] * res.value(s)).sum(1)
    )


def test_distillation_loss_and_uniform_teacher() -> None:
    torch.manual_seed(0)
    z = torch.randn(8, C)
    y = torch.randint(0, C, (8,))
    t1, t2 = torch.nn.Linear(D, C), torch.nn.Linear(D, C)
    x = torch.randn(8, D)
    p = teacher_probs([t1, t2], x, temperature=4.0)
    manual = 0.5 * (F.softmax(t1(x) / 4, -1) + F.softmax(t2(x) / 4, -1))
    assert torch.allclose(p, manual.detach())
    kl = (p * (p.log() - F.log_softmax(z / 4, -1))).sum(-1).mean()
    expect = 0.5 * F.cross_entropy(z, y) + 0.5 * 16 * kl
    assert torch.allclose(distillation_loss(z, y, p, 0.5, 4.0), expect)
    assert torch.allclose(distillation_loss(z, y, None, 0.5, 4.0), F.cross_entropy(z, y))
    one_hot = F.one_hot(y, C).float()  # zero probabilities are fine (0·log 0 = 0)
    assert bool(torch.isfinite(distillation_loss(z, y, one_hot, 0.5, 4.0)))


# --------------------------------------------------------------------------- upload choice
def test_pick_smaller_and_synthetic_counts() -> None:
    assert pick_smaller({"sequences": 10, "generator": 11}) == "sequences"
    assert pick_smaller({"sequences": 12, "generator": 11}) == "generator"
    assert pick_smaller({"sequences": 11, "generator": 11}) == "sequences"
    counts = torch.tensor([0, 1, 10, 3])
    assert synthetic_counts(counts, 1.0).tolist() == [0, 1, 10, 3]
    assert synthetic_counts(counts, 0.1).tolist() == [0, 1, 1, 1]
    assert synthetic_counts(counts, 2.5).tolist() == [0, 2, 25, 8]


def test_upload_choice_on_both_sides_of_the_break_even() -> None:
    g = generator("mar")
    numel = sum(t.numel() for t in g.state_dict().values())
    per_seq = V * D * 4
    clf = {"classifier.w": torch.zeros(3, 3)}
    meta = {"num_samples": 1, "synthetic_counts": [0, 0, 0]}
    break_even = numel * 4 // per_seq
    few = torch.tensor([break_even - 20, 0, 0])
    many = torch.tensor([break_even + 20, 0, 0])
    assert choose_form("auto", clf, meta, few, g) == "sequences"
    assert choose_form("auto", clf, meta, many, g) == "generator"
    assert choose_form("generator", clf, meta, few, g) == "generator"
    # the sizes compared are those of the real messages
    sizes = candidate_sizes(clf, meta, few, g, (V, D))
    real = Upload(
        tensors={**clf, sequence_key(0): torch.randn(int(few[0]), V, D)},
        meta={**meta, "form": "sequences"},
    )
    assert sizes["sequences"] == real.nbytes


# --------------------------------------------------------------------------- method


def upload_of(m: FALCON, ctx: SeedContext, client: int) -> Upload:
    data = ctx.splits.train.subset(ctx.federation.client_indices[client].copy())
    cctx = ClientContext(ctx.run, client, 0, torch.Generator())
    return m.client_update(cctx, m.broadcast(m.init_state(), 0), data)


def test_paper_defaults() -> None:
    cfg = method_config(FALCON)
    assert (cfg.alpha, cfg.temperature, cfg.generator, cfg.hse, cfg.kd) == (
        0.5,
        4.0,
        "mar",
        True,
        True,
    )
    g = cfg.generator_fit
    assert (g.epochs, g.batch_size, g.optimizer, g.lr, g.weight_decay) == (
        400,
        256,
        "adamw",
        1e-4,
        1e-4,
    )
    assert (
        cfg.generator_model.depth,
        cfg.generator_model.heads,
        cfg.generator_model.components,
    ) == (4, 16, 20)
    c = cfg.classifier_fit
    assert (c.epochs, c.batch_size, c.optimizer, c.lr) == (60, 256, "adam", 5e-4)
    assert cfg.server_fit == cfg.classifier_fit
    with torch.device("meta"):  # §3.6: the generator is ~144 MB at DINOv2-B scale
        g = SequenceGenerator(768, 5, 10, cfg.generator_model, "mar")
    mib = sum(t.numel() for t in g.state_dict().values()) * 4 / 2**20
    assert abs(mib - 144.33) / 144.33 < 0.03
    # the authors' code: 1.5 synthetic per real sequence, the lowest-loss generator
    assert (cfg.synthetic_ratio, cfg.generator_fit.keep, cfg.server_fit.keep) == (
        1.5,
        "lowest_loss",
        "last",
    )
    assert cfg.student_selection == "last"
    with pytest.raises(ConfigError, match="student_selection must be one of last, validation"):
        method_config(FALCON, {"student_selection": "best"})
    with pytest.raises(ConfigError, match="upload"):
        method_config(FALCON, {"upload": "both"})
    with pytest.raises(ConfigError, match="generator variant"):
        method_config(FALCON, {"generator": "gan"})


@pytest.mark.parametrize("form", ["sequences", "generator"])
def test_both_forms_pass_the_spec_and_reach_the_student(tiny, form: str) -> None:
    ctx = seed_ctx(tiny)
    m = falcon(ctx, upload=form)
    up = upload_of(m, ctx, 0)
    assert up.meta["form"] == form
    spec = m.upload_spec(m.init_state(), 0, 0)
    validate(Upload.from_bytes(up.to_bytes()), spec, client=0)
    has_seq = any(k.startswith("sequences.") for k in up.tensors)
    assert has_seq == (form == "sequences") and ("generator" in up.tensors) == (form == "generator")
    n = sum(up.meta["synthetic_counts"])
    x, y = m.synthetic_of(0, up)
    assert x.shape == (n, 5, 16) and len(y) == n
    assert torch.bincount(y, minlength=10).tolist() == up.meta["synthetic_counts"]


def test_bad_uploads_are_refused_naming_client_and_field(tiny) -> None:
    ctx = seed_ctx(tiny)
    m = falcon(ctx, upload="sequences")
    good = upload_of(m, ctx, 1)
    spec = m.upload_spec(m.init_state(), 0, 1)
    seq = next(k for k in good.tensors if k.startswith("sequences."))
    cases = {
        "classifier.head.weight": torch.zeros(3, 3),  # wrong shape
        "classifier.query": good.tensors["classifier.query"].double(),  # wrong dtype
        "classifier.key.weight": torch.full_like(
            good.tensors["classifier.key.weight"], float("nan")
        ),
        seq: torch.zeros(2, 4, 16),  # 4 tokens, not 5
    }
    for key, bad in cases.items():
        broken = Upload(tensors={**good.tensors, key: bad}, meta=dict(good.meta))
        with pytest.raises(UploadError, match=r"client 1.*") as e:
            validate(broken, spec, client=1)
        assert key in str(e.value)
    nan_seq = good.tensors[seq].clone()
    nan_seq[0, 0, 0] = float("inf")
    with pytest.raises(UploadError, match="NaN or Inf") as e:
        validate(Upload(tensors={**good.tensors, seq: nan_seq}, meta=good.meta), spec, client=1)
    assert seq in str(e.value)
    with pytest.raises(UploadError, match=r"meta\.form"):
        validate(Upload(tensors=good.tensors, meta={**good.meta, "form": "both"}), spec, client=1)
    wrong_gen = Upload(tensors={**good.tensors, "generator": torch.zeros(7)}, meta=good.meta)
    with pytest.raises(UploadError, match="generator"):
        validate(wrong_gen, spec, client=1)


def test_single_class_client_uploads_and_the_server_copes(tiny) -> None:
    _, splits = tiny
    labels = splits.train.labels.numpy()
    only_3 = np.flatnonzero(labels == 3)
    rest = np.flatnonzero(labels != 3)
    fed = Federation.from_indices(
        labels,
        [only_3, rest[::2], rest[1::2]],
        scheme="manual",
        params={},
        seed=0,
        num_classes=10,
        data_fingerprint=splits.train.fingerprint(),
    )
    ctx = seed_ctx(tiny, fed)
    m = falcon(ctx)
    res = run_simulation(m, ctx.run, splits.train, fed, threads_per_client=1)
    assert res.refused == {} or res.refused == []
    assert res.state["clients"][0]["synthetic"] == round(1.5 * len(only_3))  # synthetic_ratio
    report = m.report(res.state)
    assert set(report["bytes_up"]) == {"0", "1", "2"}
    b = report["bytes_up"]["0"]
    assert b["total"] == b["classifier"] + b["sequences"] + b["generator"] + b["overhead"]
    assert report["encoder"]["weights"] == "random"
    assert report["gflops_per_sample"] > 0
    assert set(report["upload_form"].values()) <= {"sequences", "generator"}


def test_ablation_switches_change_what_is_sent(tiny) -> None:
    ctx = seed_ctx(tiny)
    no_kd = falcon(ctx, kd=False, upload="sequences")
    up = upload_of(no_kd, ctx, 2)
    assert not any(k.startswith("classifier.") for k in up.tensors)
    assert not any(k.startswith("classifier.") for k in no_kd.upload_spec({}, 0, 2).tensors)
    no_hse = falcon(ctx, hse=False, upload="sequences")
    assert no_hse.sequence_length() == 1
    up = upload_of(no_hse, ctx, 2)
    assert all(t.shape[1:] == (1, 16) for k, t in up.tensors.items() if k.startswith("sequences."))


def test_upload_choice_is_made_per_client_by_bytes(tiny) -> None:
    """A large generator loses to a client's few sequences; raising the
    synthetic ratio moves the same client to the generator."""
    ctx = seed_ctx(tiny)
    few = falcon(ctx, synthetic_ratio=1.0)
    assert upload_of(few, ctx, 0).meta["form"] == "sequences"
    many = falcon(ctx, synthetic_ratio=400.0)
    assert upload_of(many, ctx, 0).meta["form"] == "generator"


def test_end_to_end_over_both_forms_is_deterministic(tiny) -> None:
    ctx = seed_ctx(tiny)
    runs = [
        run_simulation(
            falcon(ctx, upload=f), ctx.run, ctx.splits.train, ctx.federation, threads_per_client=1
        )
        for f in ("generator", "generator")
    ]
    a, b = (r.state["student"] for r in runs)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(c["form"] == "generator" for c in runs[0].state["clients"].values())


def test_the_screen_bounds_what_the_server_must_generate(tiny) -> None:
    """Counts beyond synthetic_ratio × num_samples, no counts at all, a
    generator that cannot draw finite sequences, declared sequences that are
    absent: refused before the server generates or trains anything."""
    ctx = seed_ctx(tiny)
    m = falcon(ctx, upload="generator")
    state = m.init_state()
    good = upload_of(m, ctx, 1)
    assert good.meta["form"] == "generator" and m.screen(state, 0, 1, good) is None
    counts = good.meta["synthetic_counts"]
    huge = {**good.meta, "synthetic_counts": [n * 1000 for n in counts]}
    assert "more than" in (m.screen(state, 0, 1, Upload(good.tensors, huge)) or "")
    none = {**good.meta, "synthetic_counts": [0] * len(counts)}
    assert "no synthetic" in (m.screen(state, 0, 1, Upload(good.tensors, none)) or "")
    broken = {**good.tensors, "generator": torch.full_like(good.tensors["generator"], 3e38)}
    assert "finite" in (m.screen(state, 0, 1, Upload(broken, good.meta)) or "")
    seqs = falcon(ctx, upload="sequences")
    sent = upload_of(seqs, ctx, 1)
    key = next(k for k in sent.tensors if k.startswith("sequences."))
    hollow = Upload({k: v for k, v in sent.tensors.items() if k != key}, sent.meta)
    assert "absent" in (seqs.screen(state, 0, 1, hollow) or "")


def test_student_selection_by_validation_keeps_the_most_accurate_epoch(tiny) -> None:
    """With ``student_selection=validation`` the server's student is the epoch
    most accurate on the validation set: its accuracy there equals the best of
    the students stopped after 1 to 6 epochs (a constant schedule, so epoch
    k of a 6-epoch fit is a k-epoch fit). Without a validation set it refuses."""
    ctx = seed_ctx(tiny)
    validation = ctx.splits.test
    with pytest.raises(ConfigError, match=r"data\.validation_fraction"):
        give_validation(falcon(ctx, student_selection="validation"), None)
    give_validation(falcon(ctx), None)  # the default needs none
    base = falcon(ctx)
    uploads = {c: upload_of(base, ctx, c) for c in range(3)}

    def accuracy_on_validation(m: FALCON) -> float:
        state = m.aggregate(m.init_state(), uploads, 0)
        pred = m.predictor(state)
        x = ctx.run.eval_transform(validation.images)
        with torch.no_grad():
            return float((pred(x).argmax(-1) == validation.labels).float().mean())

    fits = [dict(FAST_FALCON["server_fit"], epochs=k, lr=0.01) for k in range(1, 7)]
    stopped = [accuracy_on_validation(falcon(ctx, server_fit=f)) for f in fits]
    chosen = falcon(ctx, server_fit=fits[-1], student_selection="validation")
    give_validation(chosen, validation)
    assert max(stopped) > stopped[-1]  # the last epoch is not the best, so the choice shows
    assert accuracy_on_validation(chosen) == pytest.approx(max(stopped))


def test_attention_weights_are_the_fused_attentions_weights() -> None:
    """``attention_weights`` is softmax(QKᵀ/√d) under the mask, row-normalised:
    times V and projected it gives the block's fused (SDPA) attention."""
    g = generator("mar")
    attn = g.blocks[0].attn
    x = torch.randn(3, V + 1, g.pos.shape[1], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        w = attn.attention_weights(x, g.attn_mask)
        _, _, v = attn._qkv(x)
        b, n, c = x.shape
        by_hand = attn.proj((w @ v).transpose(1, 2).reshape(b, n, c))
        fused = attn(x, g.attn_mask)
    assert torch.allclose(w.sum(-1), torch.ones(3, attn.heads, n), atol=1e-6)
    assert torch.allclose(by_hand, fused, atol=1e-5)


def test_layout_shapes_masks_and_inputs_without_tokens() -> None:
    """NAR: V + 1 positions (class + V queries), each query seeing the class
    token and itself (a boolean mask); AR: no tokens given equals zero tokens."""
    nar = generator("nar")
    assert nar.pos.shape[0] == V + 1
    expect = torch.eye(V + 1, dtype=torch.bool)
    expect[:, 0] = True
    assert nar.attn_mask.dtype == torch.bool and torch.equal(nar.attn_mask, expect)
    for length in (2, V):
        ar = generator("ar", length=length)
        y = torch.tensor([0, 2])
        zeros = torch.zeros(2, length, D)
        with torch.no_grad():
            assert torch.equal(ar.layout.inputs(ar, y, None), ar.layout.inputs(ar, y, zeros))
            assert ar.layout.inputs(ar, y, zeros).shape[1] == length  # class + the first V-1 tokens


@pytest.mark.parametrize("variant", ["ar", "nar"])
def test_sampling_follows_the_given_generator_and_the_tokens_drawn_so_far(variant: str) -> None:
    """Token t of an AR sample is drawn from the mixture the generator gives
    after the tokens drawn before it (a reference loop here), with the
    caller's random generator only."""
    g = generator(variant)
    y = torch.tensor([0, 1, 2])
    with torch.no_grad():
        torch.manual_seed(99)  # the global RNG must not be what draws
        got = g.layout.sample(g, y, torch.Generator().manual_seed(5))
        ref_gen = torch.Generator().manual_seed(5)
        if variant == "ar":
            z = torch.zeros(3, V, D)
            for t in range(V):
                h = g.hidden(g.layout.inputs(g, y, z))
                logit_pi, mu, logvar = g.head(h[:, t])
                z = z.clone()
                z[:, t] = sample_gmm(logit_pi, mu, logvar, ref_gen)
            ref = z
        else:
            h = g.hidden(g.layout.inputs(g, y, None))[:, 1:].reshape(3 * V, -1)
            ref = sample_gmm(*g.head(h), ref_gen).reshape(3, V, -1)
    assert torch.equal(got, ref)


def test_sampling_starts_from_tokens_on_the_generators_device() -> None:
    """The zero tokens a sequence is sampled from live where the generator's
    weights do (a CUDA generator must not start from CPU zeros); the "meta"
    device shows it without a GPU."""
    g = SequenceGenerator(3, 4, 2, GeneratorConfig(depth=1, width=8, heads=2, components=2))
    y = torch.tensor([0, 1], device="meta")
    zeros = g.to("meta").zeros_like_tokens(y, 2)
    assert zeros.device.type == "meta" and zeros.shape == (2, 2, 3)
