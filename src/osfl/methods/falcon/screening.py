"""What a FALCON upload must be (Liu et al., "Feature-Aware One-Shot Federated
Learning via Hierarchical Token Sequences", 2025, §3.6): the spec of its two
forms, and the screen for what a spec cannot say (the synthetic counts a
client may make the server generate, a generator that draws finite
sequences). docs/methods/falcon.md, "Upload".
"""

from __future__ import annotations

import math
from typing import Any

import torch

from osfl.fl.upload import NUM_SAMPLES, MetaSpec, TensorSpec, Upload, UploadSpec
from osfl.methods.falcon.base import FalconBase
from osfl.methods.falcon.upload import CLASSIFIER, FORMS, GENERATOR, sequence_key


class FalconScreening(FalconBase):
    """FALCON's ``upload_spec`` and ``screen``."""

    def upload_spec(self, state: dict[str, Any], round: int, client: int) -> UploadSpec:
        """The classifier's exact tensors (with KD), and exactly one of two
        forms, named by ``meta.form``: per-class sequences (n_c, V, D) or the
        flattened generator (P,), float32 (docs/methods/falcon.md, "Upload")."""
        v, d, c = self.sequence_length(), self.token_dim(), self.run.num_classes
        tensors = {}
        if self.config.kd:
            tensors = {
                CLASSIFIER + k: TensorSpec(tuple(t.shape), t.dtype)
                for k, t in self._templates()["classifier"].items()
            }
        sequences = {
            sequence_key(k): TensorSpec((("synthetic_counts", k), v, d), torch.float32)
            for k in range(c)
        }
        generator = {GENERATOR: TensorSpec((self._templates()["generator_numel"],), torch.float32)}
        meta = {
            "num_samples": NUM_SAMPLES,
            "synthetic_counts": MetaSpec("int_list", low=0, length=c),
        }
        forms = {"sequences": UploadSpec(optional=sequences), "generator": UploadSpec(generator)}
        assert set(forms) == set(FORMS)  # the names choose_form uses
        return UploadSpec(tensors=tensors, meta=meta, variants=forms, variant_key="form")

    def screen(self, state: dict[str, Any], round: int, client: int, upload: Upload) -> str | None:
        """What the spec cannot say: the synthetic counts must be what
        ``synthetic_ratio`` allows for ``num_samples`` (a client cannot make
        the server generate millions of sequences), at least one, and an
        uploaded generator must draw finite sequences (one probe draw per
        declared class)."""
        synth = [int(n) for n in upload.meta["synthetic_counts"]]
        bound = math.ceil(self.config.synthetic_ratio * upload.meta["num_samples"]) + len(synth)
        if sum(synth) == 0:
            return "meta.synthetic_counts declares no synthetic sequence"
        if sum(synth) > bound:
            return (
                f"meta.synthetic_counts sums to {sum(synth)}, more than synthetic_ratio × "
                f"num_samples allows ({bound})"
            )
        if upload.meta.get("form") == "sequences":
            absent = [
                k for k, n in enumerate(synth) if n > 0 and sequence_key(k) not in upload.tensors
            ]
            if absent:
                return (
                    f"meta.synthetic_counts declares class {absent[0]} but its sequences are absent"
                )
        if GENERATOR in upload.tensors:
            probe = torch.tensor([min(n, 1) for n in synth])
            draws = self._generate(client, upload, probe)
            if draws is None or not all(bool(torch.isfinite(x).all()) for x in draws.values()):
                return "the uploaded generator does not draw finite sequences"
        return None
