"""What every FALCON party builds the same way: the views and the sequence
length, the classifier and generator seeded from the run, their shapes on the
meta device, and draws from a client's uploaded generator (Liu et al.,
"Feature-Aware One-Shot Federated Learning via Hierarchical Token Sequences",
2025, §2.2). The client (:mod:`.method`), the screen (:mod:`.screening`) and
the server (:mod:`.server`) all stand on :class:`FalconBase`.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from osfl.data.imageset import ImageSet
from osfl.fl.seeds import derive_seed
from osfl.fl.upload import Upload
from osfl.methods.falcon.classifier import AttentionPoolClassifier
from osfl.methods.falcon.config import FALCONConfig
from osfl.methods.falcon.generator import SequenceGenerator
from osfl.methods.falcon.upload import GENERATOR, load_flat_state, sequences_of
from osfl.methods.frozen.base import FrozenEncoderMethod
from osfl.methods.frozen.views import ViewSet

log = logging.getLogger(__name__)


class FalconBase(FrozenEncoderMethod):
    """FALCON's builders, shared by its client, screen and server."""

    config: FALCONConfig

    def __init__(self, config: FALCONConfig, run: Any):
        super().__init__(config, run)
        self._shapes: dict[str, Any] = {}
        self._validation: ImageSet | None = None

    # --- views and shapes -----------------------------------------------
    def view_sets(self) -> list[ViewSet]:
        size = self.encoder_size()
        views = [ViewSet("global", size)]
        if self.config.hse:
            views.append(ViewSet.regions(self.config.views, size, self.run.image_shape[1]))
        return views

    def sequence_length(self) -> int:
        return sum(v.num_views for v in self.view_sets())

    # --- model builders (seeded from the run, identical for every party) ----
    def new_classifier(self, purpose: str) -> AttentionPoolClassifier:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.run.seed, "falcon", purpose))
            return AttentionPoolClassifier(
                self.token_dim(), self.run.num_classes, self.config.classifier
            )

    def new_generator(self) -> SequenceGenerator:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.run.seed, "falcon", "generator-init"))
            return SequenceGenerator(
                self.token_dim(),
                self.sequence_length(),
                self.run.num_classes,
                self.config.generator_model,
                self.config.generator,
            )

    def _generate(
        self, client: int, up: Upload, counts: torch.Tensor
    ) -> dict[int, torch.Tensor] | None:
        """``counts[c]`` draws per class from the client's uploaded generator
        (``None`` when its weights cannot draw: e.g. non-finite mixture weights)."""
        gen = self.new_generator()
        load_flat_state(gen, up.tensors[GENERATOR])
        sampler = torch.Generator().manual_seed(
            derive_seed(self.run.seed, "falcon-server-sample", client)
        )
        try:
            return sequences_of(gen.to(self.run.device), counts, sampler)
        except RuntimeError as e:  # torch.multinomial on NaN/Inf probabilities
            log.warning("falcon: client %d's generator cannot draw (%s)", client, e)
            return None

    def _templates(self) -> dict[str, Any]:
        """Shapes of the classifier's state dict and the generator's size
        (built on the meta device: no weights allocated)."""
        if not self._shapes:
            with torch.device("meta"):
                clf = AttentionPoolClassifier(
                    self.token_dim(), self.run.num_classes, self.config.classifier
                )
                gen = SequenceGenerator(
                    self.token_dim(),
                    self.sequence_length(),
                    self.run.num_classes,
                    self.config.generator_model,
                    self.config.generator,
                )
            self._shapes["classifier"] = clf.state_dict()
            self._shapes["generator_numel"] = sum(t.numel() for t in gen.state_dict().values())
        return self._shapes
