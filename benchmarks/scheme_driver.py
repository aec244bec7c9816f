"""Multi-round FL with the registered scheme methods, recording Observations.

Drives a registered :class:`~osfl.fl.method.Method` (``fedavg``, ``fedprox``,
``scaffold``, ``feddyn``, ``feddc``) round by round exactly as the simulation
runtime does (broadcast -> client_update -> aggregate), and for the attacked
clients of the attacked round builds the Observation an honest-but-curious
server holds: the broadcast, the upload, the public hyper-parameters, the
scheme's history for that client (the tensors RLU's h term reads, from the
method's :class:`~osfl.fl.method.AuditHistory` capability, as the runtime's
observers read it; none for FedAvg, which keeps no client state) and, as
ground truth, the labels of every local step (``record_step_labels``, the
runtime's own mechanism).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from omegaconf import OmegaConf

from osfl.fl.context import ClientContext, ClientState, ModelSpec, RunContext
from osfl.fl.method import METHODS, AuditHistory, capability
from osfl.fl.observation import Observation, observe
from osfl.fl.seeds import derive_seed
from osfl.fl.train_config import TrainConfig
from osfl.fl.training import record_step_labels
from osfl.privacy.simulate import model_hparams


def make_run(
    setup: Any, model_name: str, act: str, train: TrainConfig, num_clients: int, seed: int
) -> RunContext:
    kw = setup.model_kwargs(model_name, act)  # rlu_common.Setup: act, img_size, in_chans
    return RunContext(
        num_classes=setup.num_classes,
        image_shape=tuple(setup.data.train.image_shape),
        num_clients=num_clients,
        model=ModelSpec(model_name, kw),
        train=train,
        train_transform=setup.transform,
        eval_transform=setup.transform,
        seed=seed,
        device=setup.device,
    )


def drive(
    method_name: str,
    method_options: dict[str, Any],
    run: RunContext,
    clients: list,
    rounds: int,
    *,
    init_state: dict[str, torch.Tensor] | None = None,
    watch: Callable[[int, int, Observation], None] | None = None,
    watch_rounds: set[int] | None = None,
    watch_clients: set[int] | None = None,
    on_round_start: Callable[[int, dict[str, torch.Tensor]], None] | None = None,
) -> Any:
    """Run ``rounds`` rounds of ``method_name`` over ``clients`` (ImageSets).

    ``watch(round, client, obs)`` receives the Observation of every watched
    client in every watched round; ``on_round_start(round, global_state)``
    sees the global weights before each round. Returns the final server state.
    """
    cls = METHODS.get(method_name)
    cfg = cls.Config(**{"rounds": rounds, **method_options})
    method = cls(cfg, run)
    auditable = capability(method, AuditHistory)  # None: no scheme history (FedAvg)
    state = method.init_state()
    if init_state is not None:
        model_state = state.model if hasattr(state, "model") else state
        model_state.update({k: v.clone() for k, v in init_state.items()})
    hparams = {
        **method.public_hparams(),
        **model_hparams(run.model.name, run.model.kwargs, run.num_classes),
    }
    states: dict[int, ClientState] = {}
    for r in range(rounds):
        bcast = method.broadcast(state, r)
        if on_round_start is not None:
            on_round_start(r, state.model if hasattr(state, "model") else state)
        uploads = {}
        for c, data in enumerate(clients):
            if len(data) == 0:
                continue
            gen = torch.Generator().manual_seed(derive_seed(run.seed, c, r, "client"))
            own = states.setdefault(c, ClientState())  # kept between rounds, as a runtime does
            ctx = ClientContext(run=run, client_id=c, round=r, generator=gen, state=own)
            with record_step_labels() as steps:
                up = method.client_update(ctx, bcast, data)
            uploads[c] = up
            watched = (watch_rounds is None or r in watch_rounds) and (
                watch_clients is None or c in watch_clients
            )
            if watch is not None and watched:
                obs = observe(
                    c,
                    r,
                    broadcast=bcast.tensors,
                    upload=up.tensors,
                    upload_meta=up.meta,
                    hparams=hparams,
                    truth={"labels": torch.cat(steps), "num_classes": run.num_classes},
                    history={} if auditable is None else auditable.audit_history(state, c, up.meta),
                )
                watch(r, c, obs)
        state = method.aggregate(state, uploads, r)
    return state


def run_scheme(
    setup: Any,
    model: torch.nn.Module,
    clients: list,
    cfg: Any,
    sch: Any,
    attacked: list[int],
    observe: Any,
) -> list[Observation]:
    """Table 4: ``cfg.attack_round`` rounds of scheme ``sch`` then its attacked Observations."""
    opts = {
        k: v
        for k, v in OmegaConf.to_container(sch).items()
        if k not in ("name", "method", "optimizer", "momentum")
    }
    train = TrainConfig(
        steps=int(cfg.steps),
        batch_size=int(cfg.setting.batch_size),
        lr=float(cfg.lr),
        optimizer=str(sch.get("optimizer", "sgd")),
        momentum=float(sch.get("momentum", 0.9)),
        drop_last=False,
        amp=False,
    )
    run = make_run(setup, cfg.setting.model, cfg.setting.act, train, len(clients), int(cfg.seed))
    out: list[Observation] = []
    t = int(cfg.attack_round)
    drive(
        str(sch.get("method", sch.name)),
        opts,
        run,
        clients,
        t + 1,
        init_state={k: v.detach().clone() for k, v in model.state_dict().items()},
        watch=lambda r, c, obs: out.append(obs),
        watch_rounds={t},
        watch_clients=set(attacked),
    )
    return out
