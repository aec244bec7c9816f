"""``osfl pretrain`` and osfl.pretrain: weights + card, loading, objectives,
disjointness checks and argument errors, on digits with a one-block ViT."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open

from osfl.cli import main
from osfl.data.classes import resolve_classes, select_classes
from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.models import create_model, load_pretrained
from osfl.pretrain import CARD_SCHEMA, check_disjoint, pretrained_info, sha256_file
from osfl.pretrain.config import load_pretrain_config
from osfl.pretrain.export import save_encoder, upstream_block
from osfl.pretrain.mae import patchify, sincos_pos_embed
from osfl.pretrain.objectives import OBJECTIVES, ObjectiveContext
from osfl.pretrain.probe import C_GRID, fit_linear_probe
from osfl.pretrain.train import build_encoder, pretrain
from support.cli import error_line
from support.paths import ROOT
from support.pretrain import KWARGS, TINY_PRETRAIN, digits_upstream, tiny_cfg
from support.tiny import TINY_PRETRAINED_FIVE, TINY_PRETRAINED_RUN

MODEL_KW = {"img_size": 8, "patch_size": 2, "depth": 1, "embed_dim": 32, "num_heads": 2}


def write_imagefolder(root: Path, classes: tuple[str, ...] = ("ant", "bee")) -> Path:
    """A 2-class image folder with train/ and test/ splits of tiny grey PNGs."""
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in classes:
            (root / split / c).mkdir(parents=True)
            for i in range(3):
                pixels = rng.integers(0, 255, (8, 8), dtype=np.uint8)
                Image.fromarray(pixels, mode="L").save(root / split / c / f"{i}.png")
    return root


def run_config(path: Path, source: str, image_size: int = 8) -> Path:
    path.write_text(f"data:\n  source: {source}\n  image_size: {image_size}\n")
    return path


# --------------------------------------------------------------------------- the command
@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """One ``osfl pretrain`` (supervised, 3 epochs, digits 0-4) checked against a
    disjoint run config (an image folder of other classes)."""
    tmp = tmp_path_factory.mktemp("pretrain")
    folder = write_imagefolder(tmp / "folder")
    task = run_config(tmp / "task.yaml", f"imagefolder:{folder}")
    out = tmp / "enc.safetensors"
    argv = ["pretrain", "--upstream", "digits", "--classes", "0,1,2,3,4", "--epochs", "3"]
    argv += ["--disjoint-from", str(task), "--out", str(out), "--no-progress", *TINY_PRETRAIN]
    assert main(argv) == 0
    return out, json.loads(out.with_name("enc.card.json").read_text())


def test_command_writes_weights_and_a_complete_card(cli_run, capsys):
    out, card = cli_run
    assert out.is_file() and card["schema"] == CARD_SCHEMA
    assert card["weights"]["sha256"] == sha256_file(out)
    assert card["weights"]["bytes"] == out.stat().st_size
    assert card["model"] == {
        "name": "vit_tiny_patch2_16",
        "kwargs": {**MODEL_KW, "in_chans": 1},
        "num_classes": 5,
        "parameters": card["model"]["parameters"],
        "head": "trained on the upstream labels (supervised)",
    }
    up = card["upstream"]
    assert up["source"] == "digits" and up["classes"] == ["0", "1", "2", "3", "4"]
    assert up["num_images"] == 200 and up["images_per_class"] == [40] * 5
    expected = digits_upstream(tiny_cfg("upstream.classes=[0,1,2,3,4]"))
    assert up["fingerprint"] == expected.train.fingerprint()
    assert up["held_out"]["num_images"] == len(expected.held_out)
    assert card["image_size"] == 8 and len(card["normalization"]["mean"]) == 1
    assert card["objective"]["name"] == "supervised"
    training = card["training"]
    assert training["epochs"] == 3 and training["steps"] == 3 * (200 // 32)
    assert training["optimizer"]["optimizer"] == "adamw" and training["optimizer"]["lr"] == 0.003
    env = training["environment"]  # what the weights' last bits depend on
    assert env["torch"] == torch.__version__ and env["threads"] >= 1 and env["cpu_capability"]
    results = card["results"]
    assert len(results["loss_per_epoch"]) == 3 and math.isfinite(results["final_loss"])
    assert results["final_loss"] == results["loss_per_epoch"][-1]
    assert 0.0 <= results["held_out"]["accuracy"] <= 1.0
    prov = card["provenance"]
    assert prov["command"].startswith("osfl pretrain --disjoint-from=")
    assert "upstream.source=digits" in prov["command"] and "train.epochs=3" in prov["command"]
    assert prov["torch_version"] == torch.__version__ and prov["osfl_version"]
    assert prov["config"]["upstream"]["classes"] == ["0", "1", "2", "3", "4"]
    assert 'upstream.classes=["0", "1", "2", "3", "4"]' in prov["command"]


def test_the_same_command_gives_the_same_weights(cli_run, tmp_path):
    """Pretraining is deterministic on one machine: the same command, in the
    same environment (its card's ``training.environment``), writes the same
    sha256 (the card's data fingerprint names the upstream images)."""
    _, card = cli_run
    again = tmp_path / "again.safetensors"
    argv = ["pretrain", "--upstream", "digits", "--classes", "0,1,2,3,4", "--epochs", "3"]
    before = torch.get_num_threads()
    torch.set_num_threads(card["training"]["environment"]["threads"])
    try:
        assert main([*argv, "--out", str(again), "--no-progress", *TINY_PRETRAIN]) == 0
    finally:
        torch.set_num_threads(before)
    assert sha256_file(again) == card["weights"]["sha256"]


def test_pretrained_info_records_the_card_and_refuses_a_stale_one(cli_run, tmp_path):
    out, card = cli_run
    info = pretrained_info(out)
    assert info["sha256"] == card["weights"]["sha256"] and info["card"] == card
    changed = tmp_path / "enc.safetensors"
    changed.write_bytes(out.read_bytes() + b" ")
    (tmp_path / "enc.card.json").write_text(json.dumps(card))
    with pytest.raises(ConfigError, match="sha256"):
        pretrained_info(changed)
    bare = tmp_path / "other.safetensors"
    bare.write_bytes(out.read_bytes())
    assert pretrained_info(bare)["card"] is None  # a checkpoint from elsewhere: no card


def test_written_file_loads_with_the_models_own_loader(cli_run):
    out, _ = cli_run
    model = create_model("vit_tiny_patch2_16", num_classes=10, in_chans=1, **MODEL_KW)
    report = load_pretrained(model, out)
    assert report.format == "timm" and not report.missing_keys and not report.unexpected_keys
    assert set(report.dropped_keys) == {"head.weight", "head.bias"}  # 5 upstream classes, 10 here


# --------------------------------------------------------------------------- training
def test_supervised_encoder_learns_and_round_trips_exactly(tmp_path):
    cfg = tiny_cfg("upstream.classes=[0,1,2,3,4]", "upstream.max_per_class=100", "train.epochs=8")
    upstream = digits_upstream(cfg)
    result = pretrain(cfg, upstream)
    assert result.held_out["accuracy"] > 0.5  # 5 classes: chance is 0.2
    assert result.loss_per_epoch[-1] < result.loss_per_epoch[0]
    path = tmp_path / "sup.safetensors"
    save_encoder(cfg, upstream, result, path, ["test"])
    fresh = create_model(
        "vit_tiny_patch2_16", num_classes=5, in_chans=1, pretrained=path, **MODEL_KW
    )
    x = torch.randn(7, 1, 8, 8)
    assert torch.equal(fresh.eval()(x), result.encoder.eval()(x))


def test_same_seed_gives_the_same_encoder():
    cfg = tiny_cfg("upstream.classes=[0,1,2]", "train.epochs=1", "objective=dino")
    upstream = digits_upstream(cfg)
    a, b = (pretrain(cfg, upstream).encoder.state_dict() for _ in range(2))
    assert all(torch.equal(a[k], b[k]) for k in a)


def make_objective(name: str, *extra: str, total_steps: int = 40):
    cfg = tiny_cfg(f"objective={name}", *extra)
    data = digits_upstream(cfg).train
    torch.manual_seed(0)
    model = build_encoder(cfg, data.num_classes, data.image_shape)
    ctx = ObjectiveContext(
        image_size=8,
        mean=(0.3,),
        std=(0.3,),
        num_classes=data.num_classes,
        steps_per_epoch=10,
        total_steps=total_steps,
        generator=torch.Generator().manual_seed(0),
        device=torch.device("cpu"),
    )
    entry = OBJECTIVES.get(name)
    return entry(model, entry.options_from(cfg), ctx), data


def test_mae_loss_decreases_on_digits():
    objective, data = make_objective("mae")
    opt = torch.optim.AdamW([p for p in objective.parameters() if p.requires_grad], lr=3e-3)
    x = data.images[:64].float() / 255
    losses = []
    for _ in range(40):
        loss = objective.train_loss(objective, x, data.labels[:64])
        opt.zero_grad()
        loss.backward()
        opt.step()
        objective.after_step()
        losses.append(float(loss.detach()))
    assert all(math.isfinite(v) for v in losses)
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5]), losses
    assert objective.epoch_losses() == pytest.approx(
        [np.mean(losses[i : i + 10]) for i in range(0, 40, 10)]
    )


def test_mae_targets_follow_the_patch_embedding_order():
    objective, _ = make_objective("mae")
    vit = objective.model
    x = torch.randn(3, 1, 8, 8)
    w = vit.patch_embed.proj.weight  # (D, C, p, p) -> (D, p·p·C) in patchify's order
    flat = w.permute(0, 2, 3, 1).reshape(w.shape[0], -1)
    by_patchify = patchify(x, 2) @ flat.T + vit.patch_embed.proj.bias
    assert torch.allclose(by_patchify, vit.patch_embed(x), atol=1e-5)
    pos = sincos_pos_embed(16, (4, 4))
    assert pos.shape == (1, 17, 16) and torch.equal(pos[0, 0], torch.zeros(16))
    assert objective.keep == 4  # 75 % of 16 patches masked


def test_dino_loss_centre_and_teacher_follow_the_paper():
    objective, data = make_objective("dino", "dino.local_crops=1", "dino.out_dim=8")
    opts = objective.options
    torch.manual_seed(1)
    student, teacher = torch.randn(3 * 4, 8), torch.randn(2 * 4, 8)
    objective.center.copy_(torch.randn(1, 8))
    # Eq. 2 by hand: every teacher global view against every other student view
    t = torch.softmax((teacher - objective.center) / opts.teacher_temp, -1).chunk(2)
    s = torch.log_softmax(student / opts.student_temp, -1).chunk(3)
    pairs = [(0, 1), (0, 2), (1, 0), (1, 2)]
    expected = sum(-(t[i] * s[v]).sum(-1).mean() for i, v in pairs) / len(pairs)
    assert torch.allclose(objective.dino_loss(student, teacher, 3), expected)
    # Eq. 4: the centre after a step is m c + (1 - m) mean(teacher output)
    x = data.images[:4].float() / 255
    before = objective.center.clone()
    generator_state = objective.ctx.generator.get_state()
    objective.train_loss(objective, x, data.labels[:4]).backward()
    objective.ctx.generator.set_state(generator_state)
    with torch.no_grad():
        _, t_out, _ = objective.forward_pair(x, objective.ctx.generator)
    m = opts.center_momentum
    assert torch.allclose(objective.center, m * before + (1 - m) * t_out.mean(0, keepdim=True))
    # the prototypes are frozen for the first epoch, the rest trains
    objective.before_step()
    assert objective.head.prototypes.grad is None and objective.head.mlp[0].weight.grad is not None
    # EMA: teacher <- λ teacher + (1 - λ) student, λ on a cosine from 0.996 to 1
    with torch.no_grad():
        for p in objective.model.parameters():
            p.add_(0.1)
    t_before = [p.clone() for p in objective.teacher.parameters()]
    lam = objective.teacher_momentum()
    assert lam == pytest.approx(opts.momentum_teacher)
    objective.after_step()
    pairs = zip(t_before, objective.teacher.parameters(), objective.model.parameters(), strict=True)
    for tb, ta, sp in pairs:
        assert torch.allclose(ta, lam * tb + (1 - lam) * sp)
    assert all(not p.requires_grad for p in objective.teacher.parameters())
    objective.step = 40
    assert objective.teacher_momentum() == pytest.approx(1.0)


def test_self_supervised_encoder_gets_a_probe_head_and_card_numbers(tmp_path):
    cfg = tiny_cfg("upstream.classes=[0,1,2,3,4]", "train.epochs=2", "objective=mae")
    upstream = digits_upstream(cfg)
    result = pretrain(cfg, upstream)
    held = result.held_out
    assert math.isfinite(held["loss"]) and held["probe_accuracy"] > 0.4  # chance 0.2
    assert result.head.startswith("linear probe")
    _, card = save_encoder(cfg, upstream, result, tmp_path / "mae.safetensors", ["test"])
    assert card["objective"]["options"]["mask_ratio"] == 0.75
    assert card["results"]["held_out"]["probe_accuracy"] == held["probe_accuracy"]
    with safe_open(str(tmp_path / "mae.safetensors"), "pt") as f:  # the encoder only
        keys = set(f.keys())
    assert keys == set(result.encoder.state_dict())
    assert not any(k.startswith(("decoder", "mask_token")) for k in keys)


@pytest.mark.parametrize("num_classes", [2, 3])
def test_linear_probe_separates_and_folds_into_a_linear_head(num_classes):
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(num_classes), 40)
    centres = rng.normal(0, 5, (num_classes, 6))
    feats = centres[labels] + rng.normal(0, 0.5, (len(labels), 6)) + 100.0  # off-centre
    probe = fit_linear_probe(feats, labels, num_classes + 1)  # one class never seen
    assert probe.accuracy(feats, labels) == 1.0 and probe.C in C_GRID
    weight, bias = probe.as_linear()
    head = torch.nn.Linear(6, num_classes + 1)
    with torch.no_grad():
        head.weight.copy_(weight)
        head.bias.copy_(bias)
    logits = head(torch.from_numpy(feats).float()).detach().numpy()
    assert (logits.argmax(1) == labels).all()
    assert np.allclose(logits, probe.logits(feats), rtol=1e-4, atol=1e-2)


# --------------------------------------------------------------------------- upstream classes
def test_classes_by_name_or_index_are_relabelled_in_the_given_order():
    data = ImageSet(
        images=torch.zeros(6, 1, 2, 2, dtype=torch.uint8),
        labels=torch.tensor([0, 1, 2, 0, 1, 2]),
        classes=("ant", "bee", "cat"),
    )
    idx = resolve_classes(["cat", "0"], data.classes, "toy")
    assert idx == [2, 0]
    sub = select_classes(data, idx)
    assert sub.classes == ("cat", "ant") and sub.labels.tolist() == [1, 0, 1, 0]
    with pytest.raises(ConfigError, match="'dog' is not in 'toy'"):
        resolve_classes(["dog"], data.classes, "toy")
    with pytest.raises(ConfigError, match="twice"):
        resolve_classes(["ant", "0"], data.classes, "toy")


# --------------------------------------------------------------------------- disjointness
CARD = {"upstream": {"source": "digits", "classes": ["0", "1", "2"], "fingerprint": "abc"}}


def test_overlapping_upstream_is_refused_naming_the_overlap(tmp_path):
    with pytest.raises(ConfigError, match=r"'digits'.*share classes \['1', '2'\]"):
        check_disjoint(CARD, "digits", ["1", "2", "7"])
    with pytest.raises(ConfigError, match="share classes"):  # restyled digits are digits
        check_disjoint(CARD, "domains:digits", ["0"])
    with pytest.raises(ConfigError, match="fingerprint abc"):  # same content, other spec
        check_disjoint(CARD, "imagefolder:/elsewhere", ["x"], train_fingerprint="abc")
    folder = tmp_path / "data"
    folder.mkdir()
    card = {"upstream": {"source": f"imagefolder:{folder}/", "classes": ["cat"]}}
    with pytest.raises(ConfigError, match="share classes"):  # the same folder, spelt differently
        check_disjoint(card, f"imagefolder:{tmp_path}/../{tmp_path.name}/data", ["cat", "dog"])


def test_disjoint_upstream_passes():
    assert check_disjoint(CARD, "digits", ["3", "4"], train_fingerprint="other") is None
    assert check_disjoint(CARD, "imagefolder:/other", ["0", "1"]) is None
    with pytest.raises(ConfigError, match="no upstream block"):
        check_disjoint({}, "digits", ["0"])


def test_command_refuses_an_overlapping_task_before_training(tmp_path, capsys):
    task = run_config(tmp_path / "task.yaml", "digits")
    out = tmp_path / "enc.safetensors"
    argv = ["pretrain", "--upstream", "digits", "--classes", "0,1", "--out", str(out)]
    line = error_line(capsys, [*argv, "--disjoint-from", str(task), *TINY_PRETRAIN])
    assert "share classes ['0', '1']" in line and "'digits'" in line
    assert not out.exists()


def test_upstream_block_matches_what_check_disjoint_reads():
    upstream = digits_upstream(tiny_cfg("upstream.classes=[0,1]"))
    block = upstream_block(upstream)
    with pytest.raises(ConfigError, match="fingerprint"):
        check_disjoint({"upstream": block}, "other", ["x"], upstream.train.fingerprint())


# --------------------------------------------------------------------------- bad arguments
@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--objective", "byol"], "unknown pretraining objective 'byol'"),
        (["--classes", "0,42"], "class '42' is not in 'digits'"),
        (["--classes", "3"], "at least 2 classes"),
        (["train.nope=1"], "unknown pretrain key 'train.nope'"),
        (["train.epochs=0"], "epochs must be >= 1"),
        (["train.warmup_steps=5"], "warmup_epochs"),
        (["--model", "resnet99"], "resnet99"),
        (["upstream.image_size=16"], "takes 1×8×8 images but the upstream data is 1×16×16"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, extra, needle):
    argv = ["pretrain", "--upstream", "digits", "--out", str(tmp_path / "e.safetensors")]
    assert needle in error_line(capsys, [*argv, *TINY_PRETRAIN, *extra])
    assert not (tmp_path / "e.safetensors").exists()


def test_bad_output_arguments_exit_2_with_one_line(tmp_path, capsys):
    assert "--out" in error_line(capsys, ["pretrain", "--upstream", "digits"])
    assert "--upstream" in error_line(capsys, ["pretrain", "--out", "x.safetensors"])
    assert ".safetensors" in error_line(
        capsys, ["pretrain", "--upstream", "digits", "--out", str(tmp_path / "x.pt")]
    )
    existing = tmp_path / "old.safetensors"
    existing.write_bytes(b"keep me")
    assert "--force" in error_line(
        capsys, ["pretrain", "--upstream", "digits", "--out", str(existing)]
    )
    assert existing.read_bytes() == b"keep me"


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "configs").glob("pretrain_*.yaml")),
    ids=lambda p: p.name,
)
def test_shipped_pretrain_configs_are_valid(path):
    cfg = load_pretrain_config(path)
    assert cfg.upstream.classes == ["0", "1", "2", "3", "4"] and cfg.objective in OBJECTIVES
    entry = OBJECTIVES.get(cfg.objective)
    assert entry.options_from(cfg) is not None and cfg.train.drop_last


# --------------------------------------------------------------------------- runs from an encoder
def test_a_run_from_the_encoder_is_checked_and_records_it(cli_run, tmp_path, capsys):
    """``model.kwargs.pretrained`` with a card: a task with the encoder's
    classes is refused before anything trains; the other classes run, and the
    record names the weights by sha256 and their upstream."""
    out, card = cli_run
    kwargs = KWARGS.rstrip("}") + f", pretrained: {out}}}"
    args = [
        "run",
        *TINY_PRETRAINED_RUN,
        f"model.kwargs={kwargs}",
        "methods=[fedavg]",
        "train.epochs=1",
        "cache_dir=null",
        "--no-progress",
    ]
    line = error_line(capsys, [*args, "data.classes=[0,1,7]", "--out", str(tmp_path / "a")])
    assert "'0'" in line and "'1'" in line and "upstream" in line
    assert not (tmp_path / "a").exists()
    assert main([*args, "data.classes=[5,6,7,8,9]", "--out", str(tmp_path / "b")]) == 0
    (record,) = json.loads((tmp_path / "b" / "metrics.json").read_text())["records"]
    assert record["pretrained"]["sha256"] == card["weights"]["sha256"]
    assert record["pretrained"]["upstream"]["classes"] == card["upstream"]["classes"]


def test_a_run_from_an_encoder_gets_a_fresh_head_even_with_as_many_classes(cli_run):
    """The encoder's 5-class head scores digits 0-4; a 5-class task of other
    classes must not start from it (it would predict the wrong classes and
    score below chance): the trunk loads, the head is the run's own."""
    from safetensors.torch import load_file

    from osfl import assembly
    from osfl.config import load_config

    out, _ = cli_run
    kwargs = KWARGS.rstrip("}") + f", pretrained: {out}}}"
    cfg = load_config(
        None,
        [*TINY_PRETRAINED_FIVE, f"model.kwargs={kwargs}", "cache_dir=null"],
    )
    ctx = assembly.seed_context(cfg, assembly.load_splits(cfg), 0)
    model = ctx.run.model.build(ctx.run.num_classes)
    saved = load_file(str(out))
    state = model.state_dict()
    assert saved["head.weight"].shape == state["head.weight"].shape  # 5 classes both
    assert not torch.equal(saved["head.weight"], state["head.weight"])
    assert torch.equal(saved["blocks.0.attn.qkv.weight"], state["blocks.0.attn.qkv.weight"])
