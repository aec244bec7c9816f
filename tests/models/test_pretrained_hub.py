"""``hf-hub:`` ids, offline: huggingface_hub is replaced by a stand-in module
whose ``hf_hub_download`` serves files this test wrote (nothing touches the
network), or removed to check the install hint."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from osfl.errors import ConfigError
from osfl.models import create_model, export_state_dict, load_pretrained
from osfl.models.hub import HubId, parse_hub_id, resolve_checkpoint

KW = {"img_size": 28, "depth": 2, "embed_dim": 32, "num_heads": 2, "num_classes": 5}


class _NotOnHub(Exception):
    """What the stand-in raises for a file the repository does not hold."""


def fake_hub(
    monkeypatch: pytest.MonkeyPatch, files: dict[tuple[str, str], Path]
) -> list[tuple[str, str, str | None]]:
    """Install a stand-in ``huggingface_hub``; returns the list of its calls."""
    calls: list[tuple[str, str, str | None]] = []

    def hf_hub_download(repo_id: str, filename: str, *, revision: str | None = None) -> str:
        calls.append((repo_id, filename, revision))
        if (repo_id, filename) not in files:
            raise _NotOnHub(f"404 {repo_id}/{filename}")
        return str(files[repo_id, filename])

    module = types.ModuleType("huggingface_hub")
    module.hf_hub_download = hf_hub_download  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "huggingface_hub", module)
    return calls


def dinov2(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return create_model("dinov2_small", **KW).eval()


def test_parse_hub_ids() -> None:
    assert parse_hub_id("hf-hub:facebook/dinov2-small") == HubId(
        "facebook/dinov2-small", None, None
    )
    assert parse_hub_id("hf-hub:timm/vit_small_patch14_dinov2.lvd142m@v1.0") == HubId(
        "timm/vit_small_patch14_dinov2.lvd142m", "v1.0", None
    )
    hub = parse_hub_id("hf-hub:google/vit-base-patch16-224-in21k@main/sub/pytorch_model.bin")
    assert hub == HubId("google/vit-base-patch16-224-in21k", "main", "sub/pytorch_model.bin")
    assert str(hub) == "hf-hub:google/vit-base-patch16-224-in21k@main/sub/pytorch_model.bin"
    for bad in ("hf-hub:dinov2-small", "hf-hub:", "hf-hub:a/b/config.json", "hf-hub:a b/c"):
        with pytest.raises(ConfigError, match="hf-hub:"):
            parse_hub_id(bad)
    # anything else is a local path, untouched
    assert resolve_checkpoint("weights/hf-hub.safetensors") == Path("weights/hf-hub.safetensors")


def test_hub_id_loads_through_the_download_function(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = dinov2(0)
    path = tmp_path / "model.safetensors"
    save_file(export_state_dict(src, "huggingface"), str(path))
    calls = fake_hub(monkeypatch, {("facebook/dinov2-small", "model.safetensors"): path})
    model = create_model("dinov2_small", pretrained="hf-hub:facebook/dinov2-small", **KW).eval()
    assert calls == [("facebook/dinov2-small", "model.safetensors", None)]
    x = torch.randn(2, 3, 28, 28)
    torch.testing.assert_close(model.forward_features(x), src.forward_features(x))
    report = load_pretrained(dinov2(1), "hf-hub:facebook/dinov2-small")
    assert report.format == "huggingface" and report.source == "hf-hub:facebook/dinov2-small"
    assert report.summary().startswith(f"hf-hub:facebook/dinov2-small -> {path}")


def test_hub_falls_back_to_pytorch_model_bin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repository with only ``pytorch_model.bin`` (read with weights_only=True)."""
    src = dinov2(0)
    path = tmp_path / "pytorch_model.bin"
    torch.save(export_state_dict(src, "huggingface"), path)
    calls = fake_hub(monkeypatch, {("org/old", "pytorch_model.bin"): path})
    dst = dinov2(1)
    load_pretrained(dst, "hf-hub:org/old@abc123")
    assert calls == [
        ("org/old", "model.safetensors", "abc123"),
        ("org/old", "pytorch_model.bin", "abc123"),
    ]
    assert torch.equal(dst.pos_embed, src.pos_embed)


def test_hub_named_file_and_failures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "w.safetensors"
    save_file(export_state_dict(dinov2(0), "timm"), str(path))
    calls = fake_hub(monkeypatch, {("org/m", "ckpt/w.safetensors"): path})
    assert load_pretrained(dinov2(1), "hf-hub:org/m/ckpt/w.safetensors").format == "timm"
    assert calls == [("org/m", "ckpt/w.safetensors", None)]
    with pytest.raises(ConfigError, match=r"model\.safetensors: _NotOnHub.*pytorch_model\.bin"):
        load_pretrained(dinov2(1), "hf-hub:org/empty")
    with pytest.raises(ConfigError, match="local path"):
        load_pretrained(dinov2(1), "hf-hub:org/m/other.safetensors")


def test_missing_huggingface_hub_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    with pytest.raises(ConfigError, match=r"pip install huggingface_hub.*local path"):
        load_pretrained(dinov2(0), "hf-hub:facebook/dinov2-small")
    with pytest.raises(ConfigError, match="pip install huggingface_hub"):
        create_model("dinov2_small", pretrained="hf-hub:facebook/dinov2-small", **KW)
    # local files never need it
    path = tmp_path / "w.safetensors"
    save_file(export_state_dict(dinov2(0), "timm"), str(path))
    assert load_pretrained(dinov2(1), path).source is None


def test_importing_models_imports_no_hub_client() -> None:
    """huggingface_hub is optional: only an hf-hub: id imports it."""
    code = "import sys, osfl.models; print('huggingface_hub' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
