"""An Observation without the FL runtime: one client's local update, simulated.

Label-recovery experiments [Chen & Vikalo, ICML 2024, §4] attack one client's
update of one round: the server broadcasts θ^(t), the client runs ``m``
local steps of mini-batch training (``B^τ ~ D_k``, Eq. 5) and uploads θ_k^(t).
:func:`simulate_observation` does exactly that with the project's training
engine (:func:`osfl.fl.training.train_local`, so optimisers, schedules and
objective terms — FedProx, SCAFFOLD, FedDyn, FedDC — are the real ones) and
records the labels every step used as the ground truth. Tests and the
reproductions use it; a run recorded by ``osfl run ... audit=[...]`` yields
the same kind of Observation.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.fl.objectives import ObjectiveTerm
from osfl.fl.observation import Observation, observe
from osfl.fl.train_config import TrainConfig
from osfl.fl.training import train_local, training_scope

#: Transforms an update (local − global state, float tensors) before upload: a defence.
UpdateHook = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]


def model_hparams(name: str, kwargs: Mapping[str, Any] | None, num_classes: int) -> dict[str, Any]:
    """The ``hparams`` entries that let an attack rebuild the architecture."""
    return {"model": {"name": name, "kwargs": dict(kwargs or {})}, "num_classes": int(num_classes)}


def simulate_observation(
    model: nn.Module,
    data: ImageSet,
    train: TrainConfig,
    *,
    transform: Callable[..., torch.Tensor] | None = None,
    terms: Sequence[ObjectiveTerm] = (),
    scheme: str = "fedavg",
    scheme_params: Mapping[str, Any] | None = None,
    history: Mapping[str, torch.Tensor] | None = None,
    model_spec: Mapping[str, Any] | None = None,
    update_hook: UpdateHook | None = None,
    client_id: int = 0,
    round: int = 0,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> tuple[Observation, nn.Module]:
    """Train a copy of ``model`` (the global model θ^(t)) on ``data`` and observe it.

    ``train`` is the local recipe; set ``steps=m`` for the paper's "m local
    epochs of one batch each". ``terms`` are the scheme's objective terms
    (their constants go in ``scheme_params``; ``history`` holds the history
    tensors RLU's h term reads, e.g. ``history.scaffold.c.<param>``, the
    Observation's ``history``). ``model_spec`` = ``hparams["model"]`` entries from
    :func:`model_hparams` (else attacks need ``model=``). ``update_hook`` maps
    the update Δθ (float tensors) before upload, e.g. clipping + DP noise.
    Returns the Observation (with ``truth["labels"]``, the labels of every
    step in order) and the trained local model.
    """
    if len(data) == 0:
        raise ConfigError("simulate_observation: the client has no data")
    global_state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    local = copy.deepcopy(model)
    labels: list[torch.Tensor] = []
    gen = torch.Generator().manual_seed(seed)
    with training_scope(round, multi_round=True):  # one observed round of an FL scheme
        train_local(
            local,
            data,
            train,
            transform=transform,
            device=device,
            generator=gen,
            terms=terms,
            on_batch=lambda step, x, y: labels.append(y.detach().cpu()),
        )
    local_state = {k: v.detach().cpu().clone() for k, v in local.state_dict().items()}
    if update_hook is not None:
        delta = {
            k: local_state[k] - global_state[k]
            for k in global_state
            if global_state[k].is_floating_point()
        }
        delta = update_hook(delta)
        for k, d in delta.items():
            local_state[k] = global_state[k] + d
        local.load_state_dict(local_state)
    num_classes = data.num_classes
    hparams: dict[str, Any] = {
        "method": scheme,
        "train": train.public_hparams(),
        "fl": {"scheme": scheme, **dict(scheme_params or {})},
        **dict(model_spec or {}),
    }
    hparams.setdefault("num_classes", num_classes)
    obs = observe(
        client_id,
        round,
        broadcast=global_state,
        upload=local_state,
        upload_meta={"num_samples": len(data)},
        hparams=hparams,
        truth={"labels": torch.cat(labels).to(torch.int64), "num_classes": num_classes},
        history=history,
    )
    return obs, local.eval()
