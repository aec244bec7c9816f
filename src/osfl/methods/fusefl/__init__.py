"""FuseFL (Tang et al., NeurIPS 2024): progressive block-wise model fusion.

:mod:`.split` cuts a registered model into K blocks, :mod:`.modules` holds the
adaptors and the fused model, :mod:`.method` the K-round protocol."""

from osfl.methods.fusefl.method import FuseFL, FuseFLConfig
from osfl.methods.fusefl.split import SPLITTERS, split_model

__all__ = ["SPLITTERS", "FuseFL", "FuseFLConfig", "split_model"]
