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
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

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
from osfl.fl.seeds import derive_seed
from osfl.fl.tensor_fit import FitConfig, fit
from osfl.fl.upload import NUM_SAMPLES, Broadcast, MetaSpec, TensorSpec, Upload, UploadSpec
from osfl.methods.falcon.classifier import AttentionPoolClassifier, ClassifierConfig
from osfl.methods.falcon.generator import LAYOUTS, GeneratorConfig, SequenceGenerator
from osfl.methods.falcon.upload import (
    CLASSIFIER,
    FORMS,
    GENERATOR,
    choose_form,
    flatten_state,
    load_flat_state,
    sequence_key,
    sequences_of,
    synthetic_counts,
)
from osfl.methods.frozen.base import (
    TINY_VIT_SMOKE,
    FrozenEncoderMethod,
    TokenPredictor,
    flops_per_sample,
    part_bytes,
)
from osfl.methods.frozen.encoder import EncoderConfig
from osfl.methods.frozen.tokens import cached_module, encode_images, token_key_parts
from osfl.methods.frozen.views import HSEConfig, ViewSet


def _generator_fit() -> FitConfig:
    """Paper §3.1: AdamW, lr 1e-4, weight decay 1e-4, batch 256, 400 epochs;
    as in the authors' code (``s2_g.py``), gradient clipping at 2.0 (NLL
    stability) and the epoch with the lowest mean loss kept. The clip acts on
    the gradient of :meth:`SequenceGenerator.loss`, the NLL averaged over
    token positions as in their ``nll_loss``."""
    return FitConfig(
        epochs=400,
        batch_size=256,
        optimizer="adamw",
        lr=1e-4,
        weight_decay=1e-4,
        grad_clip=2.0,
        keep="lowest_loss",
    )


log = logging.getLogger(__name__)

#: How the server picks its student's weights (``FALCONConfig.student_selection``).
SELECTIONS = ("last", "validation")
NEEDS_VALIDATION = (
    "method.falcon.student_selection=validation needs a validation set: "
    "set data.validation_fraction (e.g. 0.1)"
)


def _classifier_fit() -> FitConfig:
    """Paper §3.1: Adam, lr 5e-4, batch 256, 60 epochs (local and global classifier)."""
    return FitConfig(epochs=60, batch_size=256, optimizer="adam", lr=5e-4)


@dataclass(frozen=True)
class FALCONConfig:
    """FALCON's options; defaults are the paper's (§3.1), see docs/methods/falcon.md.

    ``upload``: ``auto`` (the smaller of sequences and generator, §3.6),
    ``sequences`` or ``generator`` (forced). ``synthetic_ratio``: synthetic
    sequences per class = ratio × the client's real count of that class
    (at least one for a class it holds; none for a class it lacks); 1.5 as
    the authors' ``s2.5_sample.py`` draws (the paper does not say).
    ``student_selection``: the server student's weights after its ``last``
    epoch, or after the epoch most accurate on the run's ``validation`` set
    (``data.validation_fraction`` > 0), as the authors' ``s3_global_training.py``
    keeps the best student on validation features.
    """

    #: encode region views too (hierarchical sequences); false: the global token only
    hse: bool = True
    #: the sliding-window region views HSE encodes
    views: HSEConfig = field(default_factory=HSEConfig)
    #: how the frozen encoder runs
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    #: token-sequence generator: mar (the paper), ar or nar
    generator: str = "mar"
    #: the generator's architecture
    generator_model: GeneratorConfig = field(default_factory=GeneratorConfig)
    #: how each client trains its generator
    generator_fit: FitConfig = field(default_factory=_generator_fit)
    #: the classifier's architecture
    classifier: ClassifierConfig = field(default_factory=ClassifierConfig)
    #: how each client trains its local classifier
    classifier_fit: FitConfig = field(default_factory=_classifier_fit)
    #: how the server trains the final classifier
    server_fit: FitConfig = field(default_factory=_classifier_fit)
    #: distil the clients' classifiers into the server's (false: cross-entropy on synthetic data
    #: only)
    kd: bool = True
    #: weight of the distillation term against cross-entropy
    alpha: float = 0.5
    #: distillation temperature
    temperature: float = 4.0
    #: synthetic sequences per class, as a multiple of the client's real count of that class
    synthetic_ratio: float = 1.5
    #: what a client sends: auto (the smaller of the two), sequences or generator
    upload: str = "auto"
    #: the server student kept: after its last epoch, or its most accurate epoch on validation
    student_selection: str = "last"

    def __post_init__(self) -> None:
        LAYOUTS.get(self.generator)  # unknown variant -> ConfigError listing the valid ones
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"alpha must lie in [0, 1], got {self.alpha}")
        if self.temperature <= 0:
            raise ConfigError(f"temperature must be > 0, got {self.temperature}")
        if self.synthetic_ratio <= 0:
            raise ConfigError(f"synthetic_ratio must be > 0, got {self.synthetic_ratio}")
        if self.student_selection not in SELECTIONS:
            raise ConfigError(
                f"student_selection must be one of {', '.join(SELECTIONS)}; "
                f"got {self.student_selection!r}"
            )
        if self.upload not in ("auto", *FORMS):
            raise ConfigError(
                f"upload must be one of auto, {', '.join(FORMS)}; got {self.upload!r}"
            )


def distillation_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    teacher_probs: torch.Tensor | None,
    alpha: float,
    temperature: float,
) -> torch.Tensor:
    """Eq. 13: (1−α)·CE(z_S, y) + α·T²·KL(p_T ‖ softmax(z_S/T)) (Eqs. 11–12);
    ``teacher_probs=None`` or α = 0 is CE only (the w/o-KD ablation)."""
    ce = F.cross_entropy(logits.float(), labels)
    if teacher_probs is None or alpha == 0.0:
        return ce
    log_s = F.log_softmax(logits.float() / temperature, dim=-1)
    p = teacher_probs.float()
    kl = (torch.xlogy(p, p) - p * log_s).sum(-1).mean()
    return (1 - alpha) * ce + alpha * temperature**2 * kl


def teacher_probs(
    teachers: list[nn.Module], x: torch.Tensor, temperature: float, batch_size: int = 1024
) -> torch.Tensor:
    """Eq. 10: p_T = (1/N) Σ_n softmax(z_n(x)/T), uniform over the clients
    (not weighted by their sizes: a public-code defect)."""
    out = []
    with torch.no_grad():
        for i in range(0, len(x), batch_size):
            xb = x[i : i + batch_size]
            probs = [F.softmax(t(xb).float() / temperature, dim=-1) for t in teachers]
            out.append(torch.stack(probs).mean(0))
    return torch.cat(out)


@register_method("falcon")
class FALCON(FrozenEncoderMethod, Screening, SiteEvaluation, Reporting, ServerValidation):
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

    def __init__(self, config: FALCONConfig, run: Any):
        super().__init__(config, run)
        self._shapes: dict[str, Any] = {}
        self._validation: ImageSet | None = None

    def use_validation(self, data: ImageSet | None) -> None:
        if self.config.student_selection == "validation" and data is None:
            raise ConfigError(NEEDS_VALIDATION)
        self._validation = data

    # --- views and shapes -----------------------------------------------
    def view_sets(self) -> list[ViewSet]:
        size = self.encoder_size()
        views = [ViewSet("global", size)]
        if self.config.hse:
            views.append(ViewSet.regions(self.config.views, size, self.run.image_shape[1]))
        return views

    def sequence_length(self) -> int:
        return sum(v.num_views for v in self.view_sets())

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

    # --- server ------------------------------------------------------------
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

    def aggregate(
        self, state: dict[str, Any], uploads: Mapping[int, Upload], round: int
    ) -> dict[str, Any]:
        cfg, device = self.config, self.run.device
        seconds: dict[str, float] = {}
        t = time.perf_counter()
        xs, ys, teachers, clients = [], [], [], {}
        for c in sorted(uploads):
            up = uploads[c]
            x, y = self.synthetic_of(c, up)
            xs.append(x)
            ys.append(y)
            if cfg.kd:
                clf = self.new_classifier("classifier-init")
                clf.load_state_dict(
                    {
                        k[len(CLASSIFIER) :]: v
                        for k, v in up.tensors.items()
                        if k.startswith(CLASSIFIER)
                    }
                )
                teachers.append(clf.to(device).eval())
            clients[c] = {
                "form": up.meta["form"],
                "num_samples": up.meta["num_samples"],
                "synthetic": len(y),
                "bytes": part_bytes(
                    up,
                    {
                        "classifier": lambda k: k.startswith(CLASSIFIER),
                        "sequences": lambda k: k.startswith("sequences."),
                        "generator": lambda k: k == GENERATOR,
                    },
                ),
            }
        x_all, y_all = torch.cat(xs), torch.cat(ys)
        seconds["synthetic"] = time.perf_counter() - t
        student = self.new_classifier("student-init").to(device)
        if len(y_all) == 0:  # the screen refuses empty uploads; every draw was non-finite
            log.warning("falcon: no usable synthetic sequence: the student stays untrained")
            return {**state, "student": _cpu_state(student), "clients": clients}

        t = time.perf_counter()
        tensors = [x_all, y_all]
        if cfg.kd:
            tensors.append(teacher_probs(teachers, x_all.to(device), cfg.temperature).cpu())

        def loss(m: nn.Module, x: torch.Tensor, y: torch.Tensor, *p: torch.Tensor) -> torch.Tensor:
            return distillation_loss(m(x), y, p[0] if p else None, cfg.alpha, cfg.temperature)

        fit(
            student,
            tensors,
            loss,
            cfg.server_fit,
            generator=torch.Generator().manual_seed(derive_seed(self.run.seed, "falcon-server")),
            device=device,
            progress=self.run.progress,
            description="falcon: server student",
            score=self.validation_score() if cfg.student_selection == "validation" else None,
        )
        seconds["student"] = time.perf_counter() - t
        return {
            "encoder": state["encoder"],
            "student": _cpu_state(student),
            "clients": clients,
            "gflops_per_sample": self.generation_gflops(),
            "phases": {"seconds": {k: _rounded(v) for k, v in seconds.items()}},
        }

    def validation_score(self) -> Callable[[nn.Module], float]:
        """A student's accuracy on the validation set's sequences (encoded
        once here, by the server, which holds the encoder and the set)."""
        data = self._validation
        if data is None:
            raise ConfigError(NEEDS_VALIDATION)
        tokens = encode_images(
            self.encoder(),
            data.images,
            self.run.eval_transform,
            self.view_sets(),
            batch_size=256,
            device=self.run.device,
            progress=self.run.progress,
            description="falcon: validation sequences",
        ).to(self.run.device)
        labels = data.labels.to(self.run.device)

        def accuracy(student: nn.Module) -> float:
            hits = sum(
                int((student(tokens[i : i + 1024]).argmax(-1) == labels[i : i + 1024]).sum())
                for i in range(0, len(labels), 1024)
            )
            return hits / max(len(labels), 1)

        return accuracy

    def synthetic_of(self, client: int, up: Upload) -> tuple[torch.Tensor, torch.Tensor]:
        """A client's synthetic sequences and labels: those it sent, plus
        ``synthetic_counts`` drawn from its generator if it sent one."""
        v, d = self.sequence_length(), self.token_dim()
        xs, ys = [], []
        for c in range(self.run.num_classes):
            seqs = up.tensors.get(sequence_key(c))
            if seqs is not None and len(seqs):
                xs.append(seqs.float())
                ys.append(torch.full((len(seqs),), c, dtype=torch.int64))
        if GENERATOR in up.tensors:
            counts = torch.tensor(up.meta["synthetic_counts"], dtype=torch.int64)
            for c, seqs in (self._generate(client, up, counts) or {}).items():
                finite = torch.isfinite(seqs).flatten(1).all(1)
                if not bool(finite.all()):
                    log.warning(
                        "falcon: client %d: %d non-finite draws of class %d dropped",
                        client,
                        int((~finite).sum()),
                        c,
                    )
                xs.append(seqs[finite])
                ys.append(torch.full((int(finite.sum()),), c, dtype=torch.int64))
        if not xs:
            return torch.zeros(0, v, d), torch.zeros(0, dtype=torch.int64)
        return torch.cat(xs), torch.cat(ys)

    def generation_gflops(self) -> float:
        """GFLOPs per synthetic sequence of this generator variant (Fig. 5),
        counted on a batch of 8 draws of a freshly built generator (the count
        depends on the architecture, not on the weights)."""
        gen = self.new_generator().to(self.run.device)
        y = torch.arange(8) % self.run.num_classes
        sampler = torch.Generator().manual_seed(0)
        return round(flops_per_sample(lambda: gen.sample(y, sampler)), 6)

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


def _rounded(seconds: float) -> float:
    return round(seconds, 4)  # (``aggregate``'s ``round`` argument shadows the builtin)


def _jsonable(parts: Mapping[str, Any]) -> dict[str, Any]:
    """Cache-key parts with config dataclasses turned into dicts."""
    return {k: asdict(v) if is_dataclass(v) else v for k, v in parts.items()}


def _cpu_state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in module.state_dict().items()}
