"""IntactOFL: the clients' models kept intact as the experts of a mixture of
experts, routed by a gate the server trains data-free (method ``intactofl``).

Zeng et al., "One-Shot-but-not-Degraded Federated Learning", ACM MM 2024
(code: zenghui9977/IntactOFL, ``oneshot_intactofl.py`` and
``IntactOFLSynthesizer`` / ``MoEEnsemble`` in ``synthesizer_utils.py``; the
supplementary's Algorithm 1 and §B.2). One-shot; the client side is one-shot
FedAvg's / Ensemble's cached training (a comparison trains every client once).
The server never averages or distils the clients: for each of ``epochs``:

1. *data generation* (DENSE's synthesis, :mod:`osfl.methods.kd.dense`):
   re-initialise the generator, draw z and random labels y, take
   ``generator.steps`` Adam steps on (generator, z) minimising

       bn_weight · Σ_{all clients' BN layers} (||μ - μ̂|| + ||σ² - σ̂²||) / M
     + oh_weight · CE(MoE(x), y)
     + adv_weight · (-mean(1[argmax E ≠ argmax MoE] · T²·KL(MoE(x) || E(x))))
     + diversity_weight · (-mean_b Σ_c Var_k softmax(f_k(x))_c)

   (E: the uniform average of the client logits, T = ``adv_temperature``),
   and add the lowest-loss batch to the pool;
2. *gate training*: one pass over the whole pool (crop + flip views), the
   experts frozen, SGD on the gate minimising (paper Eq. 2)

       ce_weight · CE(MoE(x), y) + balance_weight · std(G(x))
     [ + kd_weight · T²·KL(E(x) || MoE(x)) ]  (the code's β term, off here)

The MoE is ``MoE(x) = Σ_k G(x)_k · f_k(x)`` (logits mixed), with
``G(x) = softmax over the top-k gate scores`` (zero elsewhere); with
``top_k < M`` each expert runs only on the inputs routed to it. The predictor
runs every routed client model per image, so its inference FLOPs grow with
the number of clients: :meth:`IntactOFL.report` records them per image next to
one client model's (``inference``).

Where the paper and its code differ, and what is followed here (see
docs/methods/intactofl.md):

- gate weights: the code's ``LinearGatingNetwork`` returns the raw top-k
  scores (no softmax; negative weights possible) and ``MoEEnsemble`` takes the
  *mean* over experts of weight·logits; here they are a softmax over the
  top-k scores and the mixture is their weighted sum (the MoE of the paper's
  description, the usual sparse gate of Shazeer et al., 2017);
- gate architecture: the code has only ``linear`` (one layer on the flattened
  image); the supplementary's Table 3 compares MLP / CNN / ResNet gates and
  reports its headline CIFAR-10 number with the MLP: ``gate=mlp`` is the
  default, ``gate=linear`` the code's; the hidden width is not given
  (``gate_hidden=256`` here);
- gate loss: the paper's Eq. 2 is CE + balance; the code adds β·KD to the
  plain ensemble (β = 1, T = 4) on ODS-perturbed pool images (a signed step of
  8 in normalised input units): both are options (``distill.kd_weight``,
  ``ods_eps``), off by default;
- generator loss: the paper's Eq. 1 (only its garbled supplementary text was
  reachable) names a variance of the experts' predictions; the code uses
  DENSE's BN + CE + masked adversarial KL with the MoE as teacher and the
  plain ensemble as student. The code's loss is the default; the variance
  term is ``diversity_weight`` (off);
- budgets: 40 epochs, 20 generator steps (supplementary §B.2; the code's
  yaml: 200 and 30), synthesis and gate batch 128, gate SGD lr 0.01 momentum
  0.9 weight decay 1e-4 with a cosine schedule and gradient clip 10 (code).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from osfl.errors import ConfigError
from osfl.fl.method import MethodCard, Predictor, register_method
from osfl.fl.upload import Upload
from osfl.methods.clients import WEIGHTINGS, model_from_state, probe_batch
from osfl.methods.kd.augment import AUGMENTS
from osfl.methods.kd.base import DistillationMethod, ServerSide, seeded
from osfl.methods.kd.coboosting import ods_perturb
from osfl.methods.kd.dense import build_generator, synthesize_batch
from osfl.methods.kd.distill import DistillConfig, Distiller, kd_objective
from osfl.methods.kd.generator import GeneratorConfig
from osfl.methods.kd.pool import PoolBatch, SyntheticPool
from osfl.methods.kd.priors import BNStatsLoss, adversarial_kl
from osfl.methods.kd.teacher import EnsembleTeacher
from osfl.methods.peft.flops import forward_gflops
from osfl.registry import Registry

__all__ = ["GATES", "Gate", "IntactOFL", "IntactOFLConfig", "MoEPredictor"]

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- gate
def _linear_gate(in_features: int, experts: int, hidden: int) -> nn.Module:
    """The code's ``LinearGatingNetwork``: one linear layer on the flat image."""
    return nn.Linear(in_features, experts)


def _mlp_gate(in_features: int, experts: int, hidden: int) -> nn.Module:
    """The supplementary's MLP gate (Table 3): one ReLU hidden layer."""
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, experts))


#: Gate networks: ``(in_features, experts, hidden) -> module`` giving (B, experts) scores.
GATES: Registry[Any] = Registry("intactofl gate")
GATES.add("linear", _linear_gate)
GATES.add("mlp", _mlp_gate)


class Gate(nn.Module):
    """Routes each input image to the experts: a distribution over them,
    non-zero on the ``top_k`` highest-scoring experts only (a softmax over
    those scores)."""

    def __init__(
        self, arch: str, image_shape: Sequence[int], experts: int, top_k: int, hidden: int = 256
    ):
        super().__init__()
        if not 1 <= top_k <= experts:
            raise ConfigError(f"intactofl: top_k must lie in [1, {experts}], got {top_k}")
        in_features = 1
        for s in image_shape:
            in_features *= int(s)
        self.net = GATES.get(arch)(in_features, experts, hidden)
        self.experts, self.top_k = experts, top_k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.net(x.flatten(1)).float()
        if self.top_k >= self.experts:
            return torch.softmax(scores, dim=1)
        keep = torch.zeros_like(scores, dtype=torch.bool)
        keep.scatter_(1, scores.topk(self.top_k, dim=1).indices, True)
        gates = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=1)
        if self.top_k == 1:
            # a softmax over one kept score is the constant 1: no gradient would reach
            # the gate. Straight-through: the forward stays one-hot (exactly: d - d = 0),
            # the backward is the dense softmax's.
            dense = torch.softmax(scores, dim=1)
            gates = gates + (dense - dense.detach())
        return gates


def mix(member_logits: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
    """(M, B, K) expert logits and (B, M) gate weights -> (B, K) MoE logits."""
    return torch.einsum("mbk,bm->bk", member_logits.float(), gates)


class MoEPredictor(Predictor):
    """``Σ_k G(x)_k · f_k(x)``: the intact client models mixed by the gate.

    With ``top_k`` below the number of experts, each expert runs only on the
    inputs routed to it (exact: the experts are in eval mode, so one image's
    output does not depend on its batch), which is what makes top-k routing
    cheaper at inference. The experts always stay in eval mode and frozen.
    """

    def __init__(self, experts: Sequence[nn.Module], gate: Gate, num_classes: int):
        super().__init__()
        if len(experts) != gate.experts:
            raise ConfigError(f"intactofl: {len(experts)} experts for a {gate.experts}-way gate")
        self.experts = nn.ModuleList(experts)
        for p in self.experts.parameters():
            p.requires_grad_(False)
        self.gate = gate
        self.num_classes = num_classes
        self.train(False)

    def train(self, mode: bool = True) -> MoEPredictor:
        """Only the gate changes mode; the experts keep their BN statistics."""
        super().train(mode)
        self.experts.eval()
        return self

    def mixture(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The MoE logits (B, K) and the gate weights (B, M)."""
        g = self.gate(x)
        if self.gate.top_k >= self.gate.experts:
            return mix(torch.stack([e(x) for e in self.experts]), g), g
        out = g.new_zeros(x.shape[0], self.num_classes)
        for k, expert in enumerate(self.experts):
            idx = (g[:, k] > 0).nonzero().squeeze(1)
            if idx.numel() > 0:
                out = out.index_add(0, idx, g[idx, k : k + 1] * expert(x[idx]).float())
        return out, g

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mixture(x)[0]


# --------------------------------------------------------------------------- config
def _gate_recipe() -> DistillConfig:
    """The code's gate optimiser (SGD momentum 0.9, lr 0.01, wd 1e-4, cosine
    over epochs, clip 10), batch 128; the paper's Eq. 2 loss: CE, no KD."""
    return DistillConfig(
        optimizer="sgdm",
        lr=0.01,
        momentum=0.9,
        weight_decay=1e-4,
        schedule="cosine",
        grad_clip=10.0,
        batch_size=128,
        temperature=4.0,
        kd_weight=0.0,
        ce_weight=1.0,
    )


@dataclass(frozen=True)
class IntactOFLConfig:
    """IntactOFL's options; the defaults and their sources are in the module
    docstring. ``gate`` (``mlp`` | ``linear``), ``gate_hidden``, ``top_k``
    (experts per input; null: all of them, the code's default ``topk: 1.0``);
    ``epochs`` rounds of synthesis (``synthesis_batch_size`` images,
    ``generator``) + one gate pass over the pool (``distill``: the gate's
    optimiser and its CE / KD weights, ``augment`` of the pool views,
    ``pool_size`` cap); generator loss weights ``bn_weight``, ``oh_weight``,
    ``adv_weight`` (at ``adv_temperature``), ``diversity_weight``; gate loss
    extras ``balance_weight`` and ``ods_eps`` (at ``ods_temperature``);
    ``weighting`` of the plain ensemble E; ``count_flops`` per server phase."""

    #: the gate network: mlp or linear
    gate: str = "mlp"
    #: hidden width of the mlp gate
    gate_hidden: int = 256
    #: experts (client models) each input is routed to (null: all)
    top_k: int | None = None
    #: server rounds of synthesis and gate training
    epochs: int = 40
    #: images synthesised per round
    synthesis_batch_size: int = 128
    #: the image generator and its training per round
    generator: GeneratorConfig = field(
        default_factory=lambda: GeneratorConfig(steps=20, augment="none", grad_clip=10.0)
    )
    #: weight of the generator's BatchNorm-statistics term
    bn_weight: float = 1.0
    #: weight of the generator's cross-entropy term
    oh_weight: float = 1.0
    #: weight of the generator's adversarial term
    adv_weight: float = 1.0
    #: temperature of the adversarial term
    adv_temperature: float = 3.0
    #: weight of the paper's diversity term (0: off, as the code)
    diversity_weight: float = 0.0
    #: the gate's optimiser and loss
    distill: DistillConfig = field(default_factory=_gate_recipe)
    #: weight of the expert-balance term of the gate's loss
    balance_weight: float = 0.01
    #: size of the output-diversified perturbation of pool images (0: off)
    ods_eps: float = 0.0
    #: temperature of that perturbation
    ods_temperature: float = 4.0
    #: augmentation of pool images during gate training: none, flip or crop_flip
    augment: str = "crop_flip"
    #: cap on the synthetic pool, oldest first out (null: keep all)
    pool_size: int | None = None
    #: weights of the plain client ensemble: uniform or data_size
    weighting: str = "uniform"
    #: count FLOPs per server phase into the record (slower)
    count_flops: bool = False

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(f"intactofl options: {msg}")

        GATES.get(self.gate)  # unknown name -> ConfigError listing the valid ones
        need(self.gate_hidden >= 1, f"gate_hidden must be >= 1, got {self.gate_hidden}")
        need(
            self.top_k is None or self.top_k >= 1,
            f"top_k must be >= 1 or null (every expert), got {self.top_k}",
        )
        need(self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}")
        need(self.synthesis_batch_size >= 1, "synthesis_batch_size must be >= 1")
        for name, value in (
            ("bn_weight", self.bn_weight),
            ("oh_weight", self.oh_weight),
            ("adv_weight", self.adv_weight),
            ("diversity_weight", self.diversity_weight),
            ("balance_weight", self.balance_weight),
            ("ods_eps", self.ods_eps),
        ):
            need(value >= 0, f"{name} must be >= 0, got {value}")
        need(self.adv_temperature > 0, f"adv_temperature must be > 0, got {self.adv_temperature}")
        need(self.ods_temperature > 0, f"ods_temperature must be > 0, got {self.ods_temperature}")
        need(
            self.pool_size is None or self.pool_size >= 1,
            f"pool_size must be >= 1 or null, got {self.pool_size}",
        )
        WEIGHTINGS.get(self.weighting)
        AUGMENTS.get(self.augment)


# --------------------------------------------------------------------------- method
@register_method("intactofl")
class IntactOFL(DistillationMethod):
    """Client models as intact experts; a data-free trained gate routes between them."""

    Config: ClassVar[type] = IntactOFLConfig
    card: ClassVar[MethodCard] = dataclasses.replace(
        DistillationMethod.card,
        summary=(
            "Keeps the client models intact as experts; a gate trained on synthetic images routes "
            "each input to them."
        ),
        paper='Zeng et al., "One-Shot-but-not-Degraded Federated Learning", ACM MM 2024',
        smoke=(
            "method.intactofl.epochs=3",
            "method.intactofl.synthesis_batch_size=32",
            "method.intactofl.generator.steps=5",
            "method.intactofl.distill.batch_size=32",
        ),
    )

    def top_k(self, experts: int) -> int:
        """Experts per input for ``experts`` received client models."""
        k = self.config.top_k
        return experts if k is None else min(k, experts)

    def check(self) -> None:
        k = self.config.top_k
        if k is not None and k > self.run.num_clients:
            raise ConfigError(
                f"intactofl: top_k={k} exceeds the run's {self.run.num_clients} clients "
                "(experts); use top_k <= partition.num_clients or null for all"
            )

    def starts_from(self) -> str | None:
        return None  # no single model to improve on: the experts are the clients

    def build_gate(self, experts: int) -> Gate:
        c = self.config
        return Gate(c.gate, self.run.image_shape, experts, self.top_k(experts), c.gate_hidden)

    def build_student(self, state: dict[str, Any], side: ServerSide) -> nn.Module:
        """The gate (seeded), the only thing the server trains."""
        with seeded(side.seed("gate")):
            return self.build_gate(len(side.client_ids))

    def server_train(
        self, side: ServerSide, teacher: EnsembleTeacher, student: nn.Module
    ) -> nn.Module:
        cfg: IntactOFLConfig = self.config
        assert isinstance(student, Gate)
        moe = MoEPredictor(list(teacher.members), student, self.run.num_classes).to(side.device)
        experts = len(teacher)
        gen = build_generator(side, cfg.generator)
        bn = BNStatsLoss(list(teacher.members)) if cfg.bn_weight > 0 else None
        pool = SyntheticPool(cfg.pool_size, side.device)

        def gen_loss(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
            if bn is not None:
                with bn.capture():
                    members = teacher.member_logits(x)
            else:
                members = teacher.member_logits(x)
            out = mix(members, moe.gate(x))
            terms = {"oh": cfg.oh_weight * F.cross_entropy(out, y)}
            if bn is not None:
                terms["bn"] = cfg.bn_weight * bn.value("sum").to(x.device) / experts
            if cfg.adv_weight > 0:
                plain = teacher.combine(members)
                terms["adv"] = cfg.adv_weight * adversarial_kl(
                    plain, out, cfg.adv_temperature, masked=True
                )
            if cfg.diversity_weight > 0:
                var = F.softmax(members, dim=-1).var(dim=0, unbiased=False).sum(-1).mean()
                terms["div"] = -cfg.diversity_weight * var
            loss = sum(terms.values())
            return loss, {k: float(v.detach()) for k, v in terms.items()}  # type: ignore[union-attr]

        def gate_loss(d: Distiller, batch: PoolBatch, x: torch.Tensor) -> torch.Tensor:
            if cfg.ods_eps > 0:
                x = ods_perturb(teacher, x, cfg.ods_eps, cfg.ods_temperature, side.generator)
            logits, g = moe.mixture(x)
            t = None
            if cfg.distill.kd_weight > 0:
                with torch.no_grad():
                    t = teacher(x)
            loss = kd_objective(logits, t, batch.labels, cfg.distill)
            return loss + cfg.balance_weight * g.std()

        distiller = self.pool_distiller(side, teacher, moe, loss_fn=gate_loss)

        def synthesize_epoch(epoch: int) -> dict[str, float]:
            x, y, terms = synthesize_batch(
                side, cfg.generator, cfg.synthesis_batch_size, gen, gen_loss
            )
            pool.add(x, y)
            return terms

        def log_values(gate: float, terms: dict[str, float]) -> dict[str, float]:
            return {"gate_loss": gate, **terms}

        try:
            self.synthesis_distillation_epochs(
                side, moe, distiller, pool, synthesize_epoch, log_values
            )
        finally:
            if bn is not None:
                bn.remove()
        return moe

    def aggregate(
        self, state: dict[str, Any], uploads: Mapping[int, Upload], round: int
    ) -> dict[str, Any]:
        """DistillationMethod's server loop; the state keeps only the gate as
        ``server`` (the experts are ``clients``) and the predictor's cost."""
        state = super().aggregate(state, uploads, round)
        gate = {k[len("gate.") :]: v for k, v in state["server"].items() if k.startswith("gate.")}
        state = {**state, "server": gate}
        return {**state, "inference": self.inference_cost(state)}

    def inference_cost(self, state: dict[str, Any]) -> dict[str, Any]:
        """Forward GFLOPs per image of the MoE and of one client model, on the
        server's probe batch (with top-k routing the MoE's count depends on
        where the probe images are routed)."""
        moe = self.predictor(state)
        x = probe_batch(self.run)
        moe_gflops = forward_gflops(moe, x)
        single = forward_gflops(moe.experts[0], x)
        return {
            "experts": moe.gate.experts,
            "top_k": moe.gate.top_k,
            "gflops_per_image": round(moe_gflops, 6),
            "single_client_gflops_per_image": round(single, 6),
            "ratio_to_single_client": round(moe_gflops / single, 3) if single > 0 else None,
        }

    def predictor(self, state: dict[str, Any]) -> Predictor:
        if "server" not in state:
            raise ConfigError(f"{self.name}: no gate yet (aggregate has not run)")
        ids = sorted(state["clients"])
        gate = self.build_gate(len(ids))
        gate.load_state_dict(dict(state["server"]), strict=True)
        experts = [model_from_state(self.run, state["clients"][c]) for c in ids]
        return MoEPredictor(experts, gate, self.run.num_classes).eval()

    def release(self, state: dict[str, Any]) -> dict[str, Any]:
        """The gate and the members: the MoE *is* every client's model."""
        return {"server": state["server"], "clients": state["clients"]}

    def report(self, state: dict[str, Any]) -> dict[str, Any]:
        """Server phase times (and FLOPs with ``count_flops``) and the
        predictor's inference FLOPs per image vs one client model."""
        out = super().report(state)
        if "inference" in state:
            out["inference"] = state["inference"]
        return out
