"""Sparse model inversion of ViT clients (FedMITR Sec. IV-A, Algorithm 1, lines 4-12).

Shen et al., "Provable Sparse Inversion and Token Relabel Enhanced One-shot Federated
Learning with ViTs" (FedMITR), building on Hu et al.,
"Sparse Model Inversion: Efficient Inversion of Vision Transformers for
Data-Free Applications" (SMI, ICML 2024, code: Egg-Hu/SMI).

Pixels start from Gaussian noise with uniformly drawn labels and are
optimised by Adam (part A's engine, :func:`osfl.methods.kd.pixels.invert`)
on Eq. 5-6:

    CE(f_i(x), y) - alpha · JS(f_i(x), f_S(x)) + alpha_TV · TV(x) + alpha_l2 · ||x||

What makes it *sparse* lives here, in the ``forward`` handed to the engine:

- every patch is "kept" at first; at each iteration in ``schedule.stop_at``
  the kept patches are ranked by the class token's attention in the **last**
  block, averaged over heads, recorded at the *previous* iteration, and the
  lowest of them stop being inverted (mask ratio ``r`` of the *remaining*
  patches, as SMI's ``prune_ratio``): ``K - floor(r·K)`` of the ``K`` stay
  (``kept_count="remaining"``, default) or SMI's ``floor(K·(1 - r))``
  (``kept_count="smi"``; one fewer whenever ``r·K`` is not an integer);
- a stopped patch leaves the token set: the client (and the student in the
  JS term) run ``forward(x, keep_idx)`` on the kept patch tokens only, so it
  gets no forward or backward computation at all, and by default its pixels
  are frozen through the engine's ``update_mask`` (Adam's momentum cannot
  move them). SMI's code masks nothing: its stopped pixels keep moving under
  the image priors (TV, l2) and Adam's momentum (``stopped_pixels="priors"``);
- the engine's random roll / flip jitter moves image content; the kept
  indices (stored in the un-jittered frame) are remapped to the jittered
  patch grid (a roll moves a patch by the nearest whole number of patches,
  a flip mirrors the column), and the attention columns are mapped back.
- the returned batch is the last iterate (``keep="last"``, FedMITR's
  Algorithm 1) or, as SMI's and ADI's codes, the iterate of lowest loss
  (``keep="best"``); SMI then recomputes the kept-patch mask from that
  batch's dense last-block attention, as done here (same kept count).

Stop schedule: the paper gives only r = 0.3. SMI's code stops at iterations
(50, 100, 200, 300) of its inversion; we express the schedule as fractions of
the iterations (default (0.1, 0.2, 0.4, 0.6), i.e. SMI's iterations over
500), so it scales with ``iterations`` (100 in FedMITR's Appendix A ->
stops at 10, 20, 40, 60; 64 patches -> 45, 32, 23, 17 kept).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.methods.kd.pixels import InversionConfig, InversionResult, InversionState, Jitter, invert
from osfl.methods.kd.space import InputSpace
from osfl.models.vit import VisionTransformer, pool_tokens
from osfl.registry import Registry

__all__ = [
    "KEPT_COUNTS",
    "STOPPED_PIXELS",
    "SparseInversionResult",
    "StopSchedule",
    "forward_with_cls_attention",
    "idx_from_keep_mask",
    "invert_sparse",
    "keep_mask_from_idx",
    "patch_grid",
    "pixel_mask",
    "remap_keep_idx",
    "stop_lowest",
    "top_attention",
]


#: ``kept_count`` rule -> patches kept when ``ratio`` of ``remaining`` stop (before the
#: floor of one kept patch): ours keeps ``remaining - floor(ratio·remaining)``, SMI's code
#: ``int(remaining·(1 - ratio))`` (``get_top_k_relative_indices_including_first``).
KEPT_COUNTS: Registry[Callable[[int, float], int]] = Registry("kept_count rule")
KEPT_COUNTS.add("remaining", lambda remaining, ratio: remaining - math.floor(ratio * remaining))
KEPT_COUNTS.add("smi", lambda remaining, ratio: int(remaining * (1.0 - ratio)))

#: what happens to the pixels of stopped patches (see the module docstring)
STOPPED_PIXELS = ("frozen", "priors")


@dataclass(frozen=True)
class StopSchedule:
    """When patches stop being inverted and how many.

    ``stop_at``: fractions of the inversion iterations in (0, 1) (sorted,
    distinct after rounding); ``ratio`` (FedMITR's mask ratio r): the share of
    the *remaining* patches stopped at each of them, counted by the
    ``kept_count`` rule (:data:`KEPT_COUNTS`). ``ratio = 0`` or an empty
    ``stop_at`` is dense inversion.
    """

    ratio: float = 0.3
    stop_at: tuple[float, ...] = (0.1, 0.2, 0.4, 0.6)
    kept_count: str = "remaining"

    def __post_init__(self) -> None:
        KEPT_COUNTS.get(self.kept_count)
        if not 0.0 <= self.ratio < 1.0:
            raise ConfigError(f"mask_ratio must lie in [0, 1), got {self.ratio}")
        if any(not 0.0 < f < 1.0 for f in self.stop_at):
            raise ConfigError(f"stop_at must be fractions in (0, 1), got {list(self.stop_at)}")
        if list(self.stop_at) != sorted(set(self.stop_at)):
            raise ConfigError(f"stop_at must be strictly increasing, got {list(self.stop_at)}")

    @property
    def sparse(self) -> bool:
        return self.ratio > 0 and len(self.stop_at) > 0

    def iterations(self, total: int) -> tuple[int, ...]:
        """The stop iterations for an inversion of ``total`` iterations (>= 1, so
        that a previous iteration's attention exists)."""
        if not self.sparse:
            return ()
        its = sorted({max(1, min(total - 1, round(f * total))) for f in self.stop_at})
        return tuple(i for i in its if i < total)

    @staticmethod
    def kept_after_stop(remaining: int, ratio: float, rule: str = "remaining") -> int:
        """Patches kept when ``ratio`` of ``remaining`` stop (at least one is kept)."""
        return max(1, KEPT_COUNTS.get(rule)(remaining, ratio))

    def kept(self, remaining: int) -> int:
        """This schedule's kept count after one stop."""
        return self.kept_after_stop(remaining, self.ratio, self.kept_count)

    def kept_counts(self, num_patches: int, total: int) -> list[int]:
        """Kept patches after each stop iteration (for tests and docs)."""
        counts, k = [], num_patches
        for _ in self.iterations(total):
            k = self.kept(k)
            counts.append(k)
        return counts


# --------------------------------------------------------------------------- index plumbing
Grid = tuple[int, int, int, int]  # rows, columns, patch height, patch width


def patch_grid(model: VisionTransformer) -> Grid:
    """(rows, columns, patch height, patch width) of a ViT's patch grid."""
    gh, gw = model.patch_embed.grid_size
    ph, pw = model.patch_embed.patch_size
    return int(gh), int(gw), int(ph), int(pw)


def _nearest_patches(shift: int, patch: int) -> int:
    """A pixel shift in whole patches, rounded half away from zero (symmetric)."""
    n = math.floor(abs(shift) / patch + 0.5)
    return n if shift >= 0 else -n


def remap_keep_idx(keep_idx: torch.Tensor, jitter: Jitter, grid: Grid) -> torch.Tensor:
    """Patch indices of the un-jittered image -> indices in ``jitter.apply(image)``.

    ``Jitter.apply`` rolls by ``(dy, dx)`` pixels then flips columns; a patch
    moves by the nearest whole number of patches, half away from zero
    (exact when the shift is a multiple of the patch size). Order is preserved, so column ``k`` of any
    per-token output still belongs to ``keep_idx[:, k]``.
    """
    gh, gw, ph, pw = grid
    row, col = keep_idx // gw, keep_idx % gw
    sy, sx = _nearest_patches(jitter.dy, ph), _nearest_patches(jitter.dx, pw)
    row, col = (row + sy) % gh, (col + sx) % gw
    if jitter.flip:
        col = gw - 1 - col
    return row * gw + col


def keep_mask_from_idx(keep_idx: torch.Tensor, num_patches: int) -> torch.Tensor:
    """(B, K) indices -> (B, N) boolean mask of kept patches."""
    mask = torch.zeros(keep_idx.shape[0], num_patches, dtype=torch.bool, device=keep_idx.device)
    return mask.scatter_(1, keep_idx, True)


def idx_from_keep_mask(mask: torch.Tensor, keep: bool = True) -> torch.Tensor:
    """(B, N) mask with the same count per row -> (B, K) sorted indices of
    kept (``keep=True``) or stopped patches."""
    m = mask if keep else ~mask
    counts = m.sum(1)
    if bool((counts != counts[0]).any()):
        raise ConfigError("every image of a batch must keep the same number of patches")
    return m.nonzero()[:, 1].view(m.shape[0], int(counts[0]))


def pixel_mask(keep_mask: torch.Tensor, grid: Grid) -> torch.Tensor:
    """(B, N) patch mask -> (B, 1, H, W) float pixel mask (1 = still inverted)."""
    gh, gw, ph, pw = grid
    m = keep_mask.view(-1, 1, gh, gw).float()
    return m.repeat_interleave(ph, dim=2).repeat_interleave(pw, dim=3)


def stop_lowest(
    keep_idx: torch.Tensor, attention: torch.Tensor, ratio: float, rule: str = "remaining"
) -> torch.Tensor:
    """Keep the ``kept_after_stop`` patches of highest attention (B, K') sorted.

    ``attention`` (B, K) is aligned with ``keep_idx`` (B, K).
    """
    k = StopSchedule.kept_after_stop(keep_idx.shape[1], ratio, rule)
    return top_attention(keep_idx, attention, k)


def top_attention(keep_idx: torch.Tensor, attention: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` entries of ``keep_idx`` (B, K) of highest ``attention`` (B, K), sorted."""
    top = attention.topk(k, dim=1).indices
    return keep_idx.gather(1, top).sort(dim=1).values


def forward_with_cls_attention(
    model: VisionTransformer, x: torch.Tensor, keep_idx: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and the last block's class-token-to-patch attention (head mean)
    in one pass (the attention costs one extra softmax of the last block, not
    a second forward). Equal to ``model(x, keep_idx)`` and
    ``model.attention_maps(x, keep_idx=keep_idx)``: the class token and the
    register tokens (DINOv2-reg) come first, so the patch columns start after
    ``model.num_prefix_tokens``."""
    prefix = model.num_prefix_tokens
    t = model.blocks[:-1](model.embed(x, keep_idx))
    last = model.blocks[-1]
    with torch.no_grad():
        attn = last.attn.attention_weights(last.norm1(t))[:, :, 0, prefix:].mean(dim=1)
    t = model.norm(last(t))
    return model.forward_head(pool_tokens(t, model.global_pool, model.fc_norm, prefix)), attn


# --------------------------------------------------------------------------- the inversion
@dataclass
class SparseInversionResult:
    """The engine's result plus the final kept-patch mask (B, N) (un-jittered frame)."""

    result: InversionResult
    keep_mask: torch.Tensor
    kept_history: list[int]

    @property
    def images(self) -> torch.Tensor:
        return self.result.images

    @property
    def labels(self) -> torch.Tensor:
        return self.result.labels


def invert_sparse(
    client: nn.Module,
    labels: torch.Tensor,
    image_shape: tuple[int, int, int],
    cfg: InversionConfig,
    schedule: StopSchedule,
    *,
    student: nn.Module | None = None,
    space: InputSpace | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
    stopped_pixels: str = "frozen",
) -> SparseInversionResult:
    """Invert one batch from one client ViT with the stop schedule (Alg. 1, 6-11).

    ``student`` (the server ViT) is needed when ``cfg.js_weight > 0``; it sees
    the same kept tokens. ``stopped_pixels``: ``frozen`` (default) or
    ``priors`` (SMI's code: no update mask). With ``cfg.keep="best"`` the
    kept-patch mask is recomputed from the returned batch (SMI's code).
    """
    if not isinstance(client, VisionTransformer):
        raise ConfigError(
            f"FedMITR's sparse inversion needs ViT clients (osfl.models.vit), got {type(client).__name__}"
        )
    if stopped_pixels not in STOPPED_PIXELS:
        raise ConfigError(
            f"stopped_pixels must be one of {', '.join(STOPPED_PIXELS)}, got {stopped_pixels!r}"
        )
    grid = patch_grid(client)
    n = client.num_patches
    b = labels.shape[0]
    stops = set(schedule.iterations(cfg.iterations))
    dev = torch.device(device)
    st: dict[str, torch.Tensor | None] = {
        "keep": torch.arange(n, device=dev).unsqueeze(0).repeat(b, 1),
        "attn": None,
    }
    history: list[int] = [n]

    def client_forward(x: torch.Tensor, state: InversionState) -> torch.Tensor:
        keep = st["keep"]
        assert keep is not None
        if state.step in stops and st["attn"] is not None:
            keep = stop_lowest(keep, st["attn"], schedule.ratio, schedule.kept_count)
            st["keep"] = keep
            history.append(int(keep.shape[1]))
            if stopped_pixels == "frozen":
                state.update_mask = pixel_mask(keep_mask_from_idx(keep, n), grid)
        jit_idx = remap_keep_idx(keep, state.jitter, grid)
        state.extras["jit_idx"] = jit_idx
        if not schedule.sparse:
            return client(x)
        logits, attn = forward_with_cls_attention(client, x, jit_idx)
        st["attn"] = attn
        return logits

    def student_forward(x: torch.Tensor, state: InversionState) -> torch.Tensor:
        assert student is not None
        if not schedule.sparse:
            return student(x)
        return student(x, keep_idx=state.extras["jit_idx"])

    res = invert(
        client_forward,
        labels,
        image_shape,
        cfg,
        space=space,
        student=student_forward if student is not None else None,
        generator=generator,
        device=dev,
    )
    keep = st["keep"]
    assert keep is not None
    if schedule.sparse and cfg.keep == "best":
        keep = _final_mask_of_best(client, res.images, keep.shape[1], dev)
    return SparseInversionResult(res, keep_mask_from_idx(keep, n).cpu(), history)


def _final_mask_of_best(
    client: VisionTransformer, images: torch.Tensor, k: int, device: torch.device
) -> torch.Tensor:
    """SMI's last step: the kept batch's ``k`` patches of highest dense last-block
    class-token attention (the best batch may predate the last stop)."""
    with torch.no_grad():
        _, attn = forward_with_cls_attention(client, images.to(device))
    every = torch.arange(attn.shape[1], device=device).expand(attn.shape[0], -1)
    return top_attention(every, attn, k)
