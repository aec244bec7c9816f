"""FedMITR (Shen et al., "FedMITR: Federated Model Inversion and Token
Relabel"): one-shot FL of ViTs by sparse model inversion of the clients and
token relabel on the server. See docs/methods/fedmitr.md.

- :mod:`.sparse_inversion`: Sec. IV-A (SMI-style sparse inversion, stop schedule);
- :mod:`.relabel`: Sec. IV-B, Eq. 8 (token relabel loss, ablation variants);
- :mod:`.method`: Algorithm 1, registered as ``fedmitr``.
"""

from osfl.methods.fedmitr.method import FedMITR, FedMITRConfig
from osfl.methods.fedmitr.relabel import (
    CLS_FILTERS,
    LOW_DENSITY_INPUTS,
    VARIANTS,
    RelabelWeights,
    TokenRelabelLoss,
    Variant,
    ensemble_on_tokens,
)
from osfl.methods.fedmitr.sparse_inversion import (
    KEPT_COUNTS,
    STOPPED_PIXELS,
    SparseInversionResult,
    StopSchedule,
    forward_with_cls_attention,
    idx_from_keep_mask,
    invert_sparse,
    keep_mask_from_idx,
    patch_grid,
    pixel_mask,
    remap_keep_idx,
    stop_lowest,
    top_attention,
)

__all__ = [
    "CLS_FILTERS",
    "KEPT_COUNTS",
    "LOW_DENSITY_INPUTS",
    "STOPPED_PIXELS",
    "VARIANTS",
    "FedMITR",
    "FedMITRConfig",
    "RelabelWeights",
    "SparseInversionResult",
    "StopSchedule",
    "TokenRelabelLoss",
    "Variant",
    "ensemble_on_tokens",
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
