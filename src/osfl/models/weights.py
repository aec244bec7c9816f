"""Load pretrained weights from timm / DeiT / DINOv2 / Hugging Face / torchvision
checkpoints.

Nothing downloads unless asked: a checkpoint is a local file (docs/design.md §6),
or an explicit ``hf-hub:owner/name`` id (:mod:`osfl.models.hub`). What this
module does is make a checkpoint fit the model, the way timm's
``checkpoint_filter_fn`` / ``resample_abs_pos_embed`` / ``adapt_input_conv``
(``timm/models/vision_transformer.py``, ``timm/layers/pos_embed.py``,
``timm/models/_manipulate.py``) do:

- reads safetensors, or ``.pth/.pt/.bin`` with ``torch.load(weights_only=True)``
  only (a pickle-only file, one that needs arbitrary code, is refused, never
  executed);
- unwraps ``{"model": ...}`` / ``{"state_dict": ...}`` nesting and
  ``module.`` / ``_orig_mod.`` prefixes;
- renames the checkpoint's key layout to this project's names
  (:mod:`osfl.models.layouts`: timm/torchvision, facebookresearch DINOv2,
  Hugging Face ViT/DeiT/DINOv2);
- resamples ``pos_embed`` bicubically when the patch grid differs (class token
  kept), drops a DeiT distillation token;
- adapts the first convolution to another number of input channels (sum for
  grey, repeat-and-rescale otherwise);
- drops the head when the class count differs.

A key whose shape still disagrees, or that needs another architecture
(register tokens, layer scale), is a :class:`~osfl.errors.ConfigError` that
names it.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from osfl.errors import ConfigError
from osfl.models.hub import is_hub_id, resolve_checkpoint
from osfl.models.layouts import LAYOUTS, detect_layout

log = logging.getLogger(__name__)

HEAD_POLICIES = ("drop_head", "error")
_NESTING_KEYS = ("state_dict", "model", "model_state", "model_state_dict", "module", "net")
_STRIP_PREFIXES = ("module.", "_orig_mod.")
#: Checkpoint keys that, when the model lacks them, mean the checkpoint is of
#: another architecture: loading the rest would silently compute something else.
_ARCH_KEYS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"reg_token$"),
        "register tokens: build the model with reg_tokens=R (e.g. dinov2_small_reg)",
    ),
    (
        re.compile(r"blocks\.\d+\.ls[12]\.gamma$"),
        "layer scale: build the model with init_values (e.g. dinov2_small)",
    ),
)


@dataclass(frozen=True)
class LoadReport:
    """What :func:`load_pretrained` did. ``missing_keys`` excludes dropped head keys."""

    path: str
    format: str  # the checkpoint's layout name: "timm", "dinov2" or "huggingface"
    loaded: tuple[str, ...]
    missing_keys: tuple[str, ...]
    unexpected_keys: tuple[str, ...]
    dropped_keys: tuple[str, ...]
    adapted: tuple[str, ...]  # human-readable notes, e.g. "pos_embed: grid 8x8 -> 4x4"
    source: str | None = None  # the hf-hub: id the file was fetched for, if any

    def summary(self) -> str:
        where = f"{self.source} -> {self.path}" if self.source else self.path
        return (
            f"{where} ({self.format}): {len(self.loaded)} loaded, {len(self.missing_keys)} missing, "
            f"{len(self.unexpected_keys)} unexpected, {len(self.dropped_keys)} dropped"
            + (f"; adapted: {'; '.join(self.adapted)}" if self.adapted else "")
        )


# --- reading ----------------------------------------------------------------
def read_state_dict(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Tensors of a checkpoint file, unwrapped and prefix-stripped (no key renaming).

    Any failure of the file (missing, truncated, bit-flipped, pickle-only, not a
    state dict, NaN/Inf weights) is one :class:`ConfigError` naming the file:
    torch's and safetensors' readers raise a zoo of exceptions on damaged input
    (``UnicodeDecodeError``, ``KeyError``, ``AssertionError``, ``IndexError``,
    ``OSError [Errno 22]``), none of which should reach a user as a traceback."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"checkpoint {str(p)!r} not found; give the path to a local weights file")
    suffix = p.suffix.lower()
    if suffix == ".safetensors":
        try:
            obj: object = load_file(str(p), device="cpu")
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise ConfigError(f"checkpoint {str(p)!r} is not a valid safetensors file: {e}") from e
    elif suffix in (".pth", ".pt", ".bin", ".ckpt"):
        try:
            obj = torch.load(str(p), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            raise ConfigError(
                f"checkpoint {str(p)!r} is pickle-only: it holds objects other than tensors "
                "and is refused (checkpoints are only ever read with weights_only=True, never "
                "unpickled); re-save its state_dict, ideally as .safetensors"
            ) from e
        except Exception as e:
            raise ConfigError(
                f"checkpoint {str(p)!r} cannot be read (damaged or not a PyTorch checkpoint): "
                f"{type(e).__name__}: {e}"
            ) from e
    else:
        raise ConfigError(
            f"checkpoint {str(p)!r}: unknown format {suffix!r}; use .safetensors, .pth, .pt or .bin"
        )
    tensors = _strip_prefixes(_unwrap(obj, str(p)))
    bad = next(
        (k for k, v in tensors.items() if v.is_floating_point() and not torch.isfinite(v).all()),
        None,
    )
    if bad is not None:
        raise ConfigError(f"checkpoint {str(p)!r}: tensor {bad!r} holds NaN or Inf")
    return tensors


def _unwrap(obj: object, where: str) -> dict[str, torch.Tensor]:
    """Descend through ``{"model": {...}}``-style nesting to the tensor dict."""
    while isinstance(obj, Mapping) and not any(isinstance(v, torch.Tensor) for v in obj.values()):
        inner = next((obj[k] for k in _NESTING_KEYS if isinstance(obj.get(k), Mapping)), None)
        if inner is None:
            break
        obj = inner
    if not isinstance(obj, Mapping):
        raise ConfigError(f"checkpoint {where!r} is not a state dict (found {type(obj).__name__})")
    tensors = {str(k): v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise ConfigError(
            f"checkpoint {where!r} holds no tensors (top-level keys: {sorted(obj)[:10]})"
        )
    return tensors


def _strip_prefixes(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in sd.items():
        changed = True
        while changed:
            changed = False
            for pre in _STRIP_PREFIXES:
                if k.startswith(pre):
                    k, changed = k[len(pre) :], True
        out[k] = v
    if out and all(k.startswith("model.") for k in out):  # e.g. Lightning modules
        out = {k[len("model.") :]: v for k, v in out.items()}
    return out


# --- shape adaptation --------------------------------------------------------
def resample_pos_embed(pos: torch.Tensor, grid: tuple[int, int], num_prefix: int) -> torch.Tensor:
    """(1, P + G·G, D) -> (1, 1 + gh·gw, D): bicubic over the square source grid;
    the class token's embedding is kept (zeros if the source has none) and any
    other prefix (DeiT's distillation token) dropped."""
    d = pos.shape[-1]
    n_old = pos.shape[1] - num_prefix
    g_old = math.isqrt(n_old)
    if g_old * g_old != n_old:
        raise ConfigError(
            f"pos_embed: {n_old} patch positions are not a square grid; cannot resample"
        )
    cls = pos[:, :1] if num_prefix else pos.new_zeros(1, 1, d)
    patches = pos[:, num_prefix:]
    if (g_old, g_old) != tuple(grid):
        img = patches.reshape(1, g_old, g_old, d).permute(0, 3, 1, 2).float()
        img = F.interpolate(img, size=grid, mode="bicubic", align_corners=False, antialias=True)
        patches = img.permute(0, 2, 3, 1).reshape(1, grid[0] * grid[1], d).to(pos.dtype)
    return torch.cat([cls, patches], dim=1)


def adapt_input_conv(w: torch.Tensor, in_chans: int) -> torch.Tensor:
    """First-conv weight (O, I, kh, kw) for ``in_chans`` inputs: sum over I for
    grey (a grey image copied to I channels gives the same output), else repeat
    the RGB filters and rescale by 3/in_chans (timm's rule)."""
    src = w.shape[1]
    if in_chans == 1:
        return w.sum(dim=1, keepdim=True)
    if src != 3:
        raise ConfigError(f"cannot adapt a {src}-channel input conv to {in_chans} channels")
    reps = math.ceil(in_chans / 3)
    return w.repeat(1, reps, 1, 1)[:, :in_chans] * (3.0 / in_chans)


def _classifier_prefix(model: nn.Module) -> str | None:
    get = getattr(model, "get_classifier", None)
    if get is None:
        return None
    head = get()
    return next((n + "." for n, m in model.named_modules() if m is head and n), None)


def _shape_hint(k: str, v: torch.Tensor, want: torch.Tensor, first_conv: str | None) -> str:
    """Why a key's shape disagrees, in terms of what to build instead."""
    if k == first_conv and "patch_embed" not in k and v.ndim == 4 and v.shape[2:] != want.shape[2:]:
        return (
            "its first convolution has another kernel: an ImageNet-stem ResNet checkpoint "
            "needs stem='imagenet', e.g. tv_resnet18 / tv_resnet50"
        )
    return "check embed_dim / depth / patch_size / reg_tokens / model name"


@dataclass
class _Fitting:
    """The model's side of one :func:`_fit` and what it has decided so far.

    The per-key steps below share this one object instead of passing eight
    arguments each; ``out``, ``dropped`` and ``notes`` are what :func:`_fit`
    returns."""

    model: nn.Module
    target: dict[str, torch.Tensor]
    head: str | None  # the classifier's parameter prefix, e.g. "head."
    first_conv: str | None  # the first 4-d weight: the input convolution
    num_prefix: int  # class token, plus DeiT's distillation token when the model lacks it
    drop_head: bool
    fresh_head: bool
    renamed: Mapping[str, str]
    out: dict[str, torch.Tensor] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        model: nn.Module,
        sd: Mapping[str, torch.Tensor],
        drop_head: bool,
        renamed: Mapping[str, str],
        fresh_head: bool,
    ) -> _Fitting:
        target = model.state_dict()
        return cls(
            model=model,
            target=target,
            head=_classifier_prefix(model),
            first_conv=next((k for k, v in target.items() if v.ndim == 4), None),
            num_prefix=2 if "dist_token" in sd and "dist_token" not in target else 1,
            drop_head=drop_head,
            fresh_head=fresh_head,
            renamed=renamed,
        )

    def show(self, k: str) -> str:
        """The key as errors name it: the checkpoint's spelling first."""
        return f"{self.renamed[k]!r} ({k!r} here)" if self.renamed.get(k, k) != k else repr(k)

    def is_head(self, k: str) -> bool:
        return self.head is not None and k.startswith(self.head)


def _fit(
    model: nn.Module,
    sd: dict[str, torch.Tensor],
    drop_head: bool,
    renamed: Mapping[str, str] | None = None,
    fresh_head: bool = False,
) -> tuple[dict[str, torch.Tensor], list[str], list[str]]:
    """Make ``sd``'s shapes match ``model``; returns (fitted, dropped, notes).
    ``fresh_head``: never load the checkpoint's classifier (it scores its
    upstream classes, not the model's, even when the counts agree).
    ``renamed`` (this project's name -> the checkpoint's) makes errors name the
    key as it appears in the file."""
    fit = _Fitting.of(model, sd, drop_head, renamed or {}, fresh_head)
    # the model's order first, so an error names its first mismatching parameter
    order = [k for k in fit.target if k in sd] + [k for k in sd if k not in fit.target]
    for k in order:
        _fit_key(fit, k, sd[k])
    head_dropped = [k for k in fit.dropped if fit.is_head(k)]
    if head_dropped:
        why = "a fresh head for the model's classes" if fresh_head else "class count differs"
        fit.notes.append(f"head dropped ({why}): {', '.join(head_dropped)}")
    return fit.out, fit.dropped, fit.notes


def _fit_key(fit: _Fitting, k: str, v: torch.Tensor) -> None:
    """One checkpoint key: refuse another architecture, drop what the model
    must not get (DeiT's distillation token, a head it should not reuse), keep
    what already fits, and hand a shape mismatch to :func:`_fit_mismatched`."""
    _refuse_other_architecture(fit, k)
    if k == "dist_token" and k not in fit.target:
        fit.dropped.append(k)
        fit.notes.append("dist_token: DeiT distillation token dropped")
        return
    want = fit.target.get(k)
    if fit.fresh_head and fit.is_head(k) and want is not None:
        fit.dropped.append(k)
        return
    if want is None or want.shape == v.shape:
        fit.out[k] = v
        return
    _fit_mismatched(fit, k, v, want)


def _refuse_other_architecture(fit: _Fitting, k: str) -> None:
    """A key the model lacks that marks another architecture (:data:`_ARCH_KEYS`)
    is an error: loading the rest would silently compute something else."""
    hint = next((h for pat, h in _ARCH_KEYS if k not in fit.target and pat.search(k)), None)
    if hint is not None:
        raise ConfigError(
            f"checkpoint key {fit.show(k)} has no counterpart in the model: the checkpoint "
            f"uses {hint}"
        )


def _fit_mismatched(fit: _Fitting, k: str, v: torch.Tensor, want: torch.Tensor) -> None:
    """A key whose shape differs from the model's: the three differences that
    have a faithful fix (patch grid, input channels, class count) are fixed;
    anything else means another architecture and is refused."""
    if k == "pos_embed" and v.ndim == 3 and v.shape[-1] == want.shape[-1]:
        _resample_pos_embed_key(fit, k, v)
        return
    if (
        k == fit.first_conv
        and v.ndim == 4
        and v.shape[0] == want.shape[0]
        and v.shape[2:] == want.shape[2:]
    ):
        fit.out[k] = adapt_input_conv(v, want.shape[1])
        fit.notes.append(f"{k}: input channels {v.shape[1]} -> {want.shape[1]}")
        return
    if fit.is_head(k) and v.shape[1:] == want.shape[1:]:
        if not fit.drop_head:
            raise ConfigError(
                f"checkpoint head {fit.show(k)} has {v.shape[0]} classes, the model "
                f"{want.shape[0]}; "
                "pass num_classes_mismatch='drop_head' to keep the model's fresh head"
            )
        fit.dropped.append(k)
        return
    raise ConfigError(
        f"checkpoint key {fit.show(k)} has shape {tuple(v.shape)} but the model expects "
        f"{tuple(want.shape)}; the checkpoint is for a different architecture "
        f"({_shape_hint(k, v, want, fit.first_conv)})"
    )


def _resample_pos_embed_key(fit: _Fitting, k: str, v: torch.Tensor) -> None:
    """``pos_embed`` for the model's patch grid; the checkpoint's prefix tokens
    count only when what remains is a square grid (some files store none)."""
    grid = tuple(fit.model.patch_embed.grid_size)  # type: ignore[union-attr]
    n_old = v.shape[1]
    num_prefix = fit.num_prefix
    prefix = num_prefix if math.isqrt(n_old - num_prefix) ** 2 == n_old - num_prefix else 0
    fit.out[k] = resample_pos_embed(v, grid, prefix)
    g_old = math.isqrt(n_old - prefix)
    fit.notes.append(f"pos_embed: grid {g_old}x{g_old} -> {grid[0]}x{grid[1]}")


def _key_sets(
    target: Mapping[str, torch.Tensor], fitted: Mapping[str, torch.Tensor], dropped: list[str]
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """``(loaded, missing, unexpected)`` keys: a dropped key and BatchNorm's
    ``num_batches_tracked`` counter are not missing (the first was refused
    on purpose, the second is not a weight)."""
    missing = tuple(
        k
        for k in target
        if k not in fitted and k not in dropped and not k.endswith("num_batches_tracked")
    )
    unexpected = tuple(k for k in fitted if k not in target)
    loaded = tuple(k for k in fitted if k in target)
    return loaded, missing, unexpected


def _refuse_mismatch(
    path: str | os.PathLike[str],
    raw: Mapping[str, torch.Tensor],
    model: nn.Module,
    keys: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]],
    strict: bool,
) -> None:
    """Refuse a checkpoint that shares no key with the model (another
    architecture, whatever ``strict`` says) and, when ``strict``, one with
    a missing or unexpected key."""
    loaded, missing, unexpected = keys
    if not loaded:
        raise ConfigError(
            f"checkpoint {str(path)!r} shares no parameter name with the model "
            f"(checkpoint keys start {sorted(raw)[:3]}, model keys {list(model.state_dict())[:3]})"
        )
    if strict and (missing or unexpected):
        raise ConfigError(
            f"checkpoint {str(path)!r} does not match the model exactly: missing {list(missing)[:10]}, "
            f"unexpected {list(unexpected)[:10]} (pass strict=False to load what matches)"
        )


def load_pretrained(
    model: nn.Module,
    path: str | os.PathLike[str],
    *,
    strict: bool = False,
    num_classes_mismatch: str = "drop_head",
    layout: str | None = None,
    fresh_head: bool = False,
) -> LoadReport:
    """Load a checkpoint into ``model`` (in place) and report what happened.

    ``path`` is a local file or an ``hf-hub:owner/name[@rev][/file]`` id
    (:mod:`osfl.models.hub`; needs ``huggingface_hub`` and, unless cached,
    internet). ``layout`` names the key layout (``timm``, ``dinov2``,
    ``huggingface``; :data:`osfl.models.layouts.LAYOUTS`); by default it is
    detected from the keys. ``strict=True`` refuses missing or unexpected keys
    (a head dropped under ``num_classes_mismatch="drop_head"`` and BatchNorm's
    ``num_batches_tracked`` counters are not counted as missing);
    ``num_classes_mismatch="error"`` refuses a head of another class count. A
    checkpoint sharing no key with the model is refused either way.
    ``fresh_head=True`` never loads the checkpoint's classifier: the model
    keeps its freshly initialised head (a downstream task whose classes are
    not the checkpoint's upstream ones, even when their counts agree).
    """
    if num_classes_mismatch not in HEAD_POLICIES:
        raise ConfigError(
            f"num_classes_mismatch must be one of {HEAD_POLICIES}, got {num_classes_mismatch!r}"
        )
    source = str(path) if is_hub_id(path) else None
    file = resolve_checkpoint(path)
    raw = read_state_dict(file)
    fmt = LAYOUTS.get(layout) if layout is not None else detect_layout(raw)
    converted = fmt.to_osfl(raw)
    sd = converted.state_dict
    fitted, dropped, notes = _fit(
        model, sd, num_classes_mismatch == "drop_head", converted.renamed, fresh_head
    )
    dropped = [*converted.dropped, *dropped]
    loaded, missing, unexpected = _key_sets(model.state_dict(), fitted, dropped)
    # every refusal comes before the model is touched
    _refuse_mismatch(path, raw, model, (loaded, missing, unexpected), strict)
    model.load_state_dict({k: fitted[k] for k in loaded}, strict=False)
    report = LoadReport(
        str(file),
        fmt.name,
        loaded,
        missing,
        unexpected,
        tuple(dropped),
        (*converted.notes, *notes),
        source,
    )
    log.info("loaded weights %s", report.summary())
    if missing:
        log.warning("keys left at their initial values: %s", ", ".join(missing[:20]))
    return report
