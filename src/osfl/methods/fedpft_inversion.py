"""FedPFT's adapter for the token-inversion attack
(:mod:`osfl.privacy.token_inversion`): a
:class:`~osfl.privacy.token_source.TokenSource` whose synthetic sequences are
``n_c`` draws from each uploaded class mixture ``gmm.<c>`` (what the server
trains its head on; Beitollahi et al., FedPFT, 2024, §3), one global token
per sample.

Tests build it with :func:`fedpft_token_source` and hand it to the attack.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from osfl.fl.observation import Observation
from osfl.methods.fedpft import sample_gmm_rows
from osfl.methods.frozen.inversion import check_method, token_encoder_from_observation
from osfl.privacy.token_source import TokenEncoder

__all__ = ["FedPFTTokens", "fedpft_token_source"]

#: variance floor of the draws: tiny, the uploaded variances already include
#: the clients' ``reg_covar`` (sklearn adds it when fitting)
VAR_FLOOR = 1e-6


class FedPFTTokens:
    """Draws (M, 1, D) from a FedPFT upload's class mixtures, with the public
    encoder ``encode`` whose global token they imitate."""

    def __init__(self, encode: TokenEncoder):
        self.encode = encode

    def synthetic(self, obs: Observation, generator: torch.Generator) -> torch.Tensor:
        check_method(obs, "fedpft")
        counts = obs.upload_meta.get("class_counts") or []
        parts = []
        for k, n in enumerate(counts):
            rows = obs.upload.get(f"gmm.{k}")
            if rows is not None and n > 0:
                parts.append(sample_gmm_rows(rows, int(n), generator, VAR_FLOOR)[:, None])
        return torch.cat(parts) if parts else torch.zeros(0, 1, self.encode.dim)


def fedpft_token_source(
    obs: Observation,
    image_shape: tuple[int, int, int],
    transform: Callable[[torch.Tensor], torch.Tensor] | None,
    *,
    run_seed: int | None = None,
    device: torch.device | str = "cpu",
) -> FedPFTTokens:
    """The adapter for ``obs``: the public encoder rebuilt from its
    hyper-parameters (``run_seed`` for a randomly initialised encoder)."""
    encode = token_encoder_from_observation(
        obs, image_shape, transform, run_seed=run_seed, device=device
    )
    return FedPFTTokens(encode)
