"""FALCON's adapter for the token-inversion attack (Liu et al., FALCON
(2025), §3.5, Table 5; :mod:`osfl.privacy.token_inversion`): a
:class:`~osfl.privacy.token_source.TokenSource` whose synthetic sequences are
what the server holds from a FALCON upload — the uploaded ``sequences.<c>``
tensors, plus ``synthetic_counts`` draws from an uploaded generator (what the
server itself would train on).

The benchmark (``benchmarks/falcon_inversion.py``) and tests build it with
:func:`falcon_token_source` and hand it to the attack.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from osfl.fl.observation import Observation
from osfl.methods.falcon.generator import GeneratorConfig, SequenceGenerator
from osfl.methods.falcon.upload import GENERATOR, load_flat_state, sequences_of
from osfl.methods.frozen.inversion import check_method, token_encoder_from_observation
from osfl.privacy.label_recovery.base import ObservationError
from osfl.privacy.token_source import TokenEncoder

__all__ = ["FalconTokens", "falcon_token_source"]


class FalconTokens:
    """The synthetic sequences (M, V, D) of a FALCON upload, either form,
    with the public encoder ``encode`` they live in."""

    def __init__(self, encode: TokenEncoder):
        self.encode = encode

    def synthetic(self, obs: Observation, generator: torch.Generator) -> torch.Tensor:
        check_method(obs, "falcon")
        encode = self.encode
        parts = [t.float() for k, t in sorted(obs.upload.items()) if k.startswith("sequences.")]
        if GENERATOR in obs.upload:
            gen = self._generator(obs)
            counts = torch.tensor(obs.upload_meta.get("synthetic_counts") or [], dtype=torch.int64)
            parts += list(sequences_of(gen, counts, generator).values())
        return torch.cat(parts) if parts else torch.zeros(0, encode.num_views, encode.dim)

    def _generator(self, obs: Observation) -> SequenceGenerator:
        """The uploaded generator, rebuilt from the public ``fl`` options."""
        fl = obs.hparams.get("fl") or {}
        k = obs.hparams.get("num_classes")
        if not isinstance(k, int):
            raise ObservationError(
                "a generator upload needs hparams.num_classes",
                field="hparams.num_classes",
                client=obs.client_id,
                round=obs.round,
            )
        gen = SequenceGenerator(
            self.encode.dim,
            self.encode.num_views,
            k,
            GeneratorConfig(**(fl.get("generator_model") or {})),
            str(fl.get("generator", "mar")),
        )
        flat = obs.upload[GENERATOR]
        need = sum(t.numel() for t in gen.state_dict().values())
        if flat.numel() != need:
            raise ObservationError(
                f"{flat.numel()} values, the generator of the public options has {need}",
                field=f"upload.{GENERATOR}",
                client=obs.client_id,
                round=obs.round,
            )
        load_flat_state(gen, flat)
        return gen


def falcon_token_source(
    obs: Observation,
    image_shape: tuple[int, int, int],
    transform: Callable[[torch.Tensor], torch.Tensor] | None,
    *,
    run_seed: int | None = None,
    device: torch.device | str = "cpu",
) -> FalconTokens:
    """The adapter for ``obs``: the public encoder and views rebuilt from its
    hyper-parameters (:func:`~osfl.methods.frozen.inversion.token_encoder_from_observation`;
    ``run_seed`` for a randomly initialised encoder)."""
    encode = token_encoder_from_observation(
        obs, image_shape, transform, run_seed=run_seed, device=device
    )
    return FalconTokens(encode)
