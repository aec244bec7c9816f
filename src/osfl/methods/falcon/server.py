"""FALCON's server (Liu et al., "Feature-Aware One-Shot Federated Learning via
Hierarchical Token Sequences", 2025, §2.2 step 4, §2.6): pool every client's
synthetic sequences (those sent, and those drawn from a sent generator),
distil a fresh student from the clients' classifiers (:mod:`.distill`),
optionally keeping its epoch most accurate on the run's validation set.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.fl.seeds import derive_seed
from osfl.fl.tensor_fit import fit
from osfl.fl.upload import Upload
from osfl.methods.falcon.base import FalconBase
from osfl.methods.falcon.config import NEEDS_VALIDATION
from osfl.methods.falcon.distill import distillation_loss, teacher_probs
from osfl.methods.falcon.upload import CLASSIFIER, GENERATOR, sequence_key
from osfl.methods.frozen.base import flops_per_sample, part_bytes
from osfl.methods.frozen.tokens import encode_images

log = logging.getLogger(__name__)


class FalconServer(FalconBase):
    """FALCON's ``aggregate`` and what it needs."""

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
        counted on a batch of 8 draws of a freshly built generator on the CPU
        (the count depends on the architecture, not on the weights or the
        device)."""
        gen = self.new_generator()
        y = torch.arange(8) % self.run.num_classes
        sampler = torch.Generator().manual_seed(0)
        return round(flops_per_sample(lambda: gen.sample(y, sampler)), 6)


def _rounded(seconds: float) -> float:
    return round(seconds, 4)  # (``aggregate``'s ``round`` argument shadows the builtin)


def _cpu_state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in module.state_dict().items()}
