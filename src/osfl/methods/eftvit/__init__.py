"""EFTViT ("EFTViT: Efficient Federated Training of Vision Transformers with
Masked Images on Resource-Constrained Clients"): masked-image
training of private local modules on the clients (:mod:`.client`), median
sampling of the uploaded patch features (:mod:`.sampling`, :mod:`.upload`),
training of the global module on the server (:mod:`.server`), the method
``eftvit`` (:mod:`.method`) and what median sampling shows a server
(:mod:`.privacy`). See docs/methods/eftvit.md.
"""

from osfl.methods.eftvit.client import EFTViTNet, MaskedTraining, local_names, num_kept
from osfl.methods.eftvit.method import EFTViT, EFTViTConfig, EFTViTState
from osfl.methods.eftvit.privacy import histogram_exposure
from osfl.methods.eftvit.sampling import (
    SamplingPlan,
    median_sample,
    plan_sampling,
    sampling_threshold,
)
from osfl.methods.eftvit.server import ServerTrainConfig, train_global_module
from osfl.methods.eftvit.upload import (
    SampledCounts,
    feature_upload_spec,
    pack_features,
    server_histogram,
    unpack_features,
)

__all__ = [
    "EFTViT",
    "EFTViTConfig",
    "EFTViTNet",
    "EFTViTState",
    "MaskedTraining",
    "SampledCounts",
    "SamplingPlan",
    "ServerTrainConfig",
    "feature_upload_spec",
    "histogram_exposure",
    "local_names",
    "median_sample",
    "num_kept",
    "pack_features",
    "plan_sampling",
    "sampling_threshold",
    "server_histogram",
    "train_global_module",
    "unpack_features",
]
