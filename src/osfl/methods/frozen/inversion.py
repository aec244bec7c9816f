"""The public encoder of a frozen-encoder run as the token-inversion attack
takes it (:class:`osfl.privacy.token_source.TokenEncoder`): images encoded
exactly as the clients did — the run's evaluation transform, the views, the
frozen encoder — rebuilt from an Observation's public hyper-parameters.

The attack (:mod:`osfl.privacy.token_inversion`) imports nothing from the
methods; the methods' adapters (FALCON: :mod:`osfl.methods.falcon.inversion`,
FedPFT: :mod:`osfl.methods.fedpft_inversion`) build on this module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from osfl.fl.context import ModelSpec
from osfl.fl.observation import Observation
from osfl.methods.frozen.encoder import EncoderConfig, FrozenEncoder, build_encoder
from osfl.methods.frozen.tokens import encode_images
from osfl.methods.frozen.views import HSEConfig, ViewSet
from osfl.privacy.label_recovery.base import ObservationError

__all__ = ["FrozenTokenEncoder", "check_method", "token_encoder_from_observation"]


class FrozenTokenEncoder:
    """uint8 images (N, C, H, W) -> token sequences (N, V, D) exactly as the
    clients computed them: the run's evaluation transform, then the views,
    then the frozen encoder (a :class:`~osfl.privacy.token_source.TokenEncoder`)."""

    def __init__(
        self,
        encoder: FrozenEncoder,
        views: Sequence[ViewSet],
        transform: Callable[[torch.Tensor], torch.Tensor] | None,
        batch_size: int = 128,
    ):
        self.encoder, self.views, self.transform = encoder, list(views), transform
        self.batch_size = batch_size

    @property
    def num_views(self) -> int:
        return sum(v.num_views for v in self.views)

    @property
    def dim(self) -> int:
        return self.encoder.dim

    def __call__(self, images: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
        return encode_images(
            self.encoder,
            images,
            self.transform,
            self.views,
            batch_size=self.batch_size,
            device=torch.device(device),
        )


def token_encoder_from_observation(
    obs: Observation,
    image_shape: tuple[int, int, int],
    transform: Callable[[torch.Tensor], torch.Tensor] | None,
    *,
    run_seed: int | None = None,
    device: torch.device | str = "cpu",
) -> FrozenTokenEncoder:
    """The public encoder and views of a frozen-encoder run, rebuilt from the
    Observation's hyper-parameters (``model``, ``num_classes`` and the
    method's ``fl`` options). A randomly initialised encoder (no
    ``model.kwargs.pretrained``) also needs the run's seed."""

    def bad(msg: str, fld: str) -> ObservationError:
        return ObservationError(msg, field=fld, client=obs.client_id, round=obs.round)

    spec = obs.hparams.get("model")
    fl = obs.hparams.get("fl") or {}
    k = obs.hparams.get("num_classes")
    if not isinstance(spec, Mapping) or "name" not in spec or not isinstance(k, int):
        raise bad("needs hparams.model = {name, kwargs} and hparams.num_classes", "hparams.model")
    if not isinstance(fl.get("encoder"), Mapping):
        raise bad("not a frozen-encoder run (no hparams.fl.encoder)", "hparams.fl.encoder")
    cfg = EncoderConfig(**fl["encoder"])
    kwargs = dict(spec.get("kwargs") or {})
    if cfg.size is not None:
        kwargs["img_size"] = cfg.size
    size = int(kwargs.get("img_size", image_shape[1]))
    if "pretrained" not in kwargs and run_seed is None:
        raise bad(
            "the encoder is randomly initialised: pass run_seed= to rebuild it", "hparams.model"
        )
    encoder = build_encoder(ModelSpec(str(spec["name"]), kwargs), size, k, run_seed or 0, device)
    views = [ViewSet("global", size)]
    if fl.get("hse"):
        views.append(ViewSet.regions(HSEConfig(**(fl.get("views") or {})), size, image_shape[1]))
    return FrozenTokenEncoder(encoder, views, transform, cfg.batch_size)


def check_method(obs: Observation, name: str) -> None:
    """Refuse an Observation of another method (one without ``hparams.method``,
    e.g. hand-made, is taken as is): an adapter reads one method's upload."""
    observed = obs.hparams.get("method")
    if observed is not None and str(observed) != name:
        raise ObservationError(
            f"this token source reads {name!r} uploads, the observation is of {observed!r}",
            field="hparams.method",
            client=obs.client_id,
            round=obs.round,
        )
