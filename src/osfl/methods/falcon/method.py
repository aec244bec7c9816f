"""FALCON as an osfl :class:`~osfl.fl.method.Method` (one-shot).

Liu et al., "Feature-Aware One-Shot Federated Learning via Hierarchical Token
Sequences" (FALCON, 2025), §2.2 (four steps), §2.3–2.6, §3.1 (settings),
§3.6 (upload choice):

1. the server announces the frozen encoder (its weight hash; nothing else is
   broadcast, :mod:`osfl.methods.frozen.base`);
2. each client encodes its images with HSE into sequences [s⁽⁰⁾, s⁽¹⁾..s⁽ᴸ⁾]
   (cached by content), trains the M-AR generator (Eq. 5) and, for
   distillation, a local classifier (Eqs. 6–9, CE) on the real sequences;
3. it uploads the classifier plus *either* synthetic sequences sampled from
   its generator *or* the generator itself — whichever serialises to fewer
   bytes (§3.6; measured on the exact messages, ``meta.form`` says which);
4. the server samples sequences from uploaded generators, pools every
   client's synthetic sequences and trains a fresh student of the same
   design with (1−α)·CE + α·T²·KL(p_T ‖ p_S), p_T the *uniform* mean over
   clients of softmax(z_n/T) (Eqs. 10–13). The global model is the frozen
   HSE encoder + the student (:class:`~osfl.methods.frozen.base.TokenPredictor`).

Ablations (Table 3): ``hse=false`` (global token only), ``kd=false`` (CE
only; no classifier is uploaded), ``generator=ar|nar``
(:mod:`osfl.methods.falcon.generator`). The public code's defects listed in
docs/methods/falcon.md are avoided by construction (one sequence length,
one s⁽⁰⁾ per sequence, one normalisation, no noise on server features,
uniform teachers, a freshly initialised student).

The method is split by job: :mod:`.config` (options), :mod:`.base` (what
every party builds), this module (the class and its client, steps 2–3),
:mod:`.screening` (the upload's spec and screen), :mod:`.server` (step 4) and
:mod:`.distill` (Eqs. 10–13).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.fl.context import ClientContext
from osfl.fl.method import (
    MethodCard,
    Predictor,
    Reporting,
    Screening,
    ServerValidation,
    SiteEvaluation,
    register_method,
)
from osfl.fl.tensor_fit import fit
from osfl.fl.upload import Broadcast, Upload
from osfl.methods.falcon.classifier import AttentionPoolClassifier
from osfl.methods.falcon.config import NEEDS_VALIDATION, FALCONConfig
from osfl.methods.falcon.generator import SequenceGenerator
from osfl.methods.falcon.screening import FalconScreening
from osfl.methods.falcon.server import FalconServer
from osfl.methods.falcon.upload import (
    CLASSIFIER,
    GENERATOR,
    choose_form,
    flatten_state,
    sequence_key,
    sequences_of,
    synthetic_counts,
)
from osfl.methods.frozen.base import TINY_VIT_SMOKE, FrozenEncoderMethod, TokenPredictor
from osfl.methods.frozen.tokens import cached_module, token_key_parts


@register_method("falcon")
class FALCON(
    FalconServer,
    FalconScreening,
    Screening,
    SiteEvaluation,
    Reporting,
    ServerValidation,
):
    """Server state: ``{"encoder", "student", "clients": {id: {form, bytes,
    num_samples, synthetic}}, "gflops_per_sample", "phases"}``."""

    # its own fits: generator_fit, classifier_fit, server_fit
    trains_with_recipe: ClassVar[bool] = False
    card: ClassVar[MethodCard] = dataclasses.replace(
        FrozenEncoderMethod.card,
        summary=(
            "Clients of a frozen encoder send synthetic token sequences (or their generator); the "
            "server distils a classifier."
        ),
        paper=(
            'Liu et al., "Feature-Aware One-Shot Federated Learning via Hierarchical Token '
            'Sequences" (FALCON), 2025'
        ),
        uploads="synthetic_data",  # token sequences, or the generator
        smoke=(
            *TINY_VIT_SMOKE,
            "method.falcon.views={input_size: 16, window: 8, stride: 8}",
            "method.falcon.generator_model={depth: 1, heads: 2, components: 3}",
            "method.falcon.generator_fit={epochs: 20, batch_size: 128, optimizer: adamw, lr: 0.005}",
            "method.falcon.classifier_fit={epochs: 20, batch_size: 128, lr: 0.005}",
            "method.falcon.server_fit={epochs: 20, batch_size: 128, lr: 0.005}",
            "method.falcon.synthetic_ratio=2.0",
        ),
    )

    Config: ClassVar[type] = FALCONConfig

    config: FALCONConfig

    def use_validation(self, data: ImageSet | None) -> None:
        if self.config.student_selection == "validation" and data is None:
            raise ConfigError(NEEDS_VALIDATION)
        self._validation = data

    def check(self) -> None:
        super().check()
        d = self.token_dim()
        g = self.config.generator_model
        width = g.width if g.width is not None else d
        if width % g.heads:
            raise ConfigError(
                f"method.falcon: generator width {width} (the token width when "
                f"generator_model.width is null) is not divisible by generator_model.heads="
                f"{g.heads}"
            )

    # --- client ------------------------------------------------------------
    def train_classifier(
        self, ctx: ClientContext, tokens: torch.Tensor, labels: torch.Tensor, key: dict[str, Any]
    ) -> AttentionPoolClassifier:
        """The local classifier on the real sequences (CE, §2.5)."""
        model = self.new_classifier("classifier-init").to(ctx.device)
        cfg = self.config.classifier_fit

        def train() -> None:
            fit(
                model,
                [tokens, labels],
                lambda m, x, y: F.cross_entropy(m(x).float(), y),
                cfg,
                generator=torch.Generator().manual_seed(ctx.seed_for("falcon-classifier")),
                device=ctx.device,
                progress=ctx.run.progress,
                description=f"client {ctx.client_id}: falcon classifier",
            )

        parts = {
            "kind": "falcon-classifier",
            **key,
            "seed": self.run.seed,
            "design": self.config.classifier,
            "fit": cfg,
        }
        return cached_module(ctx, model, _jsonable(parts), train)

    def train_generator(
        self, ctx: ClientContext, tokens: torch.Tensor, labels: torch.Tensor, key: dict[str, Any]
    ) -> SequenceGenerator:
        """The generator on the real sequences (NLL, Eq. 5)."""
        gen = self.new_generator()
        gen.set_token_stats(tokens)
        gen.to(ctx.device)
        cfg = self.config.generator_fit

        def train() -> None:
            fit(
                gen,
                [tokens, labels],
                lambda g, s, y: g.loss(y, s),
                cfg,
                generator=torch.Generator().manual_seed(ctx.seed_for("falcon-generator")),
                device=ctx.device,
                progress=ctx.run.progress,
                description=f"client {ctx.client_id}: falcon generator ({self.config.generator})",
            )

        parts = {
            "kind": "falcon-generator",
            **key,
            "seed": self.run.seed,
            "variant": self.config.generator,
            "model": self.config.generator_model,
            "fit": cfg,
            # the loss is the mean over positions (not their sum): the clip sees
            # V× smaller gradients, so a generator trained on the sum is not this one
            "loss": "nll_mean_over_positions",
        }
        return cached_module(ctx, gen, _jsonable(parts), train)

    def client_update(self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet) -> Upload:
        encoder = self.check_broadcast(ctx, broadcast)
        tokens = self.client_tokens(ctx, data, encoder)
        labels = data.labels
        key = token_key_parts(ctx, data, encoder, self.view_sets())
        counts = torch.bincount(labels, minlength=self.run.num_classes)
        synth = synthetic_counts(counts, self.config.synthetic_ratio)
        tensors: dict[str, torch.Tensor] = {}
        if self.config.kd:
            clf = self.train_classifier(ctx, tokens, labels, key)
            tensors.update({CLASSIFIER + k: v.detach().cpu() for k, v in clf.state_dict().items()})
        gen = self.train_generator(ctx, tokens, labels, key)
        meta = {"num_samples": len(data), "synthetic_counts": [int(n) for n in synth]}
        form = choose_form(self.config.upload, tensors, meta, synth, gen)
        if form == "sequences":
            sampler = torch.Generator().manual_seed(ctx.seed_for("falcon-sample"))
            for c, seqs in sequences_of(gen, synth, sampler).items():
                tensors[sequence_key(c)] = seqs
        else:
            tensors[GENERATOR] = flatten_state(gen)
        return Upload(tensors=tensors, meta={**meta, "form": form})

    # --- inference and record ----------------------------------------------
    def predictor(self, state: dict[str, Any]) -> Predictor:
        student = self.new_classifier("student-init")
        student.load_state_dict(state["student"])
        return TokenPredictor(self.encoder(), self.view_sets(), student.eval())

    def release(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"student": state["student"]}  # not the clients' classifiers

    def report(self, state: dict[str, Any]) -> dict[str, Any]:
        """Encoder identity (pretrained or random), bytes up per client by part,
        the upload form each client chose, GFLOPs per synthetic sequence and
        server phase times."""
        clients = state.get("clients", {})
        return {
            "encoder": state["encoder"],
            "sequence_length": self.sequence_length(),
            "generator": self.config.generator,
            "bytes_up": {str(c): v["bytes"] for c, v in clients.items()},
            "upload_form": {str(c): v["form"] for c, v in clients.items()},
            "synthetic_sequences": {str(c): v["synthetic"] for c, v in clients.items()},
            "gflops_per_sample": state.get("gflops_per_sample"),
            "phases": state.get("phases", {}),
        }


def _jsonable(parts: Mapping[str, Any]) -> dict[str, Any]:
    """Cache-key parts with config dataclasses turned into dicts."""
    return {k: asdict(v) if is_dataclass(v) else v for k, v in parts.items()}
