"""Shared pieces of benchmarks/repro_rlu.py: data, clients, observations, scoring.

Everything here is thin glue over the library: data from
``osfl.data.sources.load_data``, Dirichlet clients from ``make_federation``,
local updates from ``osfl.privacy.simulate.simulate_observation`` (the real
training engine), multi-round schemes through ``scheme_driver`` (the registered
methods), attacks through ``osfl.privacy.run_attack``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from osfl.data.imageset import DataSplits, ImageSet
from osfl.data.partition import make_federation
from osfl.data.sources import load_data
from osfl.data.transforms import channel_stats, default_transforms
from osfl.fl.observation import Observation
from osfl.fl.seeds import derive_seed
from osfl.fl.train_config import TrainConfig
from osfl.models import create_model
from osfl.privacy import resolve_inputs, run_attack
from osfl.privacy.simulate import model_hparams, simulate_observation


def fmt(x: float | None) -> str:
    return "-" if x is None or x != x else f"{x:.3f}"


@dataclass
class Setup:
    """Data, the clients' (deterministic) input transform and the server's auxiliary set."""

    data: DataSplits
    transform: Any
    aux: ImageSet
    train_eval: ImageSet
    mean: tuple[float, ...]
    std: tuple[float, ...]
    image_size: int
    device: torch.device

    @property
    def num_classes(self) -> int:
        return self.data.num_classes

    @property
    def channels(self) -> int:
        return int(self.data.train.images.shape[1])

    def model_kwargs(self, name: str, act: str) -> dict[str, Any]:
        """The models' keyword arguments for this data: the activation, LeNet's
        image size, and the input channels where they are not 3 (digits: 1)."""
        kw: dict[str, Any] = {"act": act}
        if name.startswith("lenet"):
            kw["img_size"] = self.image_size
        if self.channels != 3:
            kw["in_chans"] = self.channels
        return kw

    @classmethod
    def from_config(cls, cfg: Any) -> Setup:
        """The data of ``cfg.data``: ``spec`` and the loader's options that are
        set (``max_per_class``, ``test_max_per_class``, ``image_size``,
        ``channels``: e.g. 1 for the dry run's digits, ``cache_dir``)."""
        d = cfg.data
        opts = {
            k: d[k]
            for k in ("max_per_class", "test_max_per_class", "image_size", "channels", "cache_dir")
            if d.get(k) is not None
        }
        data = load_data(d.spec, **opts)
        _, transform = default_transforms(data.train, augment="none")
        mean, std = channel_stats(data.train)
        y = data.test.labels.numpy()
        rng = np.random.default_rng(cfg.seed)
        per = int(cfg.aux_per_class)
        aux_idx = np.concatenate(
            [rng.permutation(np.flatnonzero(y == c))[:per] for c in range(data.num_classes)]
        )
        ev = rng.choice(
            len(data.train),
            min(len(data.train), int(cfg.get("train_eval_size", 2000))),
            replace=False,
        )
        device = str(cfg.get("device", "cpu"))
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        return cls(data, transform, data.test.subset(np.sort(aux_idx)), data.train.subset(ev), mean, std,
                   int(data.train.images.shape[-1]), torch.device(device))  # fmt: skip


def build_model(setup: Setup, name: str, act: str, seed: int) -> torch.nn.Module:
    """A freshly initialised (untrained) model, seeded."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return create_model(name, num_classes=setup.num_classes, **_model_kwargs(setup, name, act))


def _model_kwargs(setup: Setup, name: str, act: str) -> dict[str, Any]:
    return setup.model_kwargs(name, act)


def make_clients(train: ImageSet, num_clients: int, alpha: float, seed: int) -> list[ImageSet]:
    """Dirichlet(alpha) label split (Yurochkin et al. 2019), as the paper's §4.1."""
    fed = make_federation(
        train.labels,
        "dirichlet",
        int(num_clients),
        int(seed),
        alpha=float(alpha),
        min_partition_size=1,
    )
    return [train.subset(ix) for ix in fed.client_indices]


def observe(
    setup: Setup,
    model: torch.nn.Module,
    data: ImageSet,
    s: Any,
    *,
    steps: int,
    lr: float,
    client: int,
    round: int = 0,
    hook: Callable | None = None,
    terms: Sequence[Any] = (),
    scheme: str = "fedavg",
    scheme_params: dict[str, Any] | None = None,
    history: dict[str, torch.Tensor] | None = None,
    seed: int = 0,
) -> tuple[Observation, torch.nn.Module]:
    """``m = steps`` local steps of batch ``s.batch_size`` from ``model``; the Observation."""
    train = TrainConfig(
        steps=int(steps),
        batch_size=int(s.batch_size),
        lr=float(lr),
        optimizer=str(s.get("optimizer", "sgd")),
        momentum=float(s.get("momentum", 0.9)),
        drop_last=False,
        amp=False,
    )
    spec = model_hparams(s.model, _model_kwargs(setup, s.model, s.act), setup.num_classes)
    return simulate_observation(
        model, data, train, transform=setup.transform, terms=terms, scheme=scheme,
        scheme_params=scheme_params, history=history, model_spec=spec, update_hook=hook,
        client_id=client, round=round, seed=derive_seed(seed, client, round, "local"),
        device=setup.device,
    )  # fmt: skip


def attack_observation(
    setup: Setup, obs: Observation, attacks: Sequence[str], cfg: Any
) -> dict[str, dict[str, float]]:
    """cAcc/iAcc of each attack on one Observation (the model is rebuilt once).

    A name listed in ``cfg.variants`` runs ``variants[name].attack`` with the
    variant's options (ablations such as RLU without the posterior search).
    """
    inputs = resolve_inputs(obs)
    variants = OmegaConf.to_container(cfg.get("variants") or OmegaConf.create({}))
    out = {}
    for name in attacks:
        opts = dict(variants.get(name, {}))
        base = opts.pop("attack", name)
        if base == "rlu" and cfg.get("rlu"):
            opts = {**OmegaConf.to_container(cfg.rlu), **opts}
        res = run_attack(
            base, inputs, setup.aux, transform=setup.transform, device=setup.device, **opts
        )
        out[name] = res.score(obs.truth["labels"])
    return out


def scheme_rounds(
    setup: Setup,
    model: torch.nn.Module,
    clients: list[ImageSet],
    cfg: Any,
    sch: Any,
    attacked: list[int],
) -> list[Observation]:
    """Train ``cfg.attack_round`` rounds with scheme ``sch`` and return the attacked
    clients' Observations of that round (Table 4's "t = 2")."""
    from scheme_driver import run_scheme

    return run_scheme(setup, model, clients, cfg, sch, attacked, observe)
