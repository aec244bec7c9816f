"""The client side of secure aggregation: Flower's SecAgg+ mod around osfl's
client step, on the osfl ClientApp (Message API).

SecAgg+ (Bell et al., ACM CCS 2020, Algorithm 2; Bonawitz et al., ACM CCS
2017, Fig. 4) masks each client's quantised vector so that the server learns
only the sum; :mod:`osfl.fl.secagg_config` holds the plan both sides follow.

How osfl drives Flower 1.41's client mod
(``flwr/client/mod/secure_aggregation/secaggplus_mod.py``): the mod acts only
on messages whose type is exactly ``"train"`` (mod line 138), so osfl's own
``train.osfl_update`` passes through it; :func:`add_secure_train` registers a
second handler, the default ``"train"`` action, inside the mod. The mod
answers the key-exchange and unmasking stages itself and calls the handler in
its masked-vector stage. The handler runs the plain runtime's client step
(:func:`~osfl.fl.runtime.client.run_client`, with the node's state kept as the
plain handler keeps it) and replies in the legacy ``FitRes`` layout the mod
reads (line 169): the upload's tensors (sorted by name, flat, divided by the
plan's scales) and its weight as ``num_examples``. The mod scales them by
``num_examples / max_weight``, quantises, masks, and empties every
ArrayRecord of the reply (lines 173-174) before it leaves the node. Clipping
would be silent, so the client refuses (drops out) rather than send a value
the range cannot hold, or a non-finite one (:func:`secure_vector`). Flower's
stochastic rounding draws from NumPy's global RNG: a secure run is
reproducible only within the plan's error bound.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Context, Error, Message
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import Code, FitRes, Parameters, Status
from flwr.compat.common import recorddict_compat as compat
from flwr.compat.common.parameter import ndarray_to_bytes

from osfl.errors import ConfigError, UploadError
from osfl.fl.runtime.client import run_client
from osfl.fl.secagg_config import (
    BROADCAST_TENSOR_TYPE,
    SECURE_WEIGHTINGS,
    QuantizationPlan,
    SecureKey,
    layout_digest,
)
from osfl.fl.upload import Upload
from osfl.flower.client import (
    ERROR_CLIENT_FAILED,
    _state_file,
    _write_atomically,
    partition_id,
)
from osfl.flower.records import read_state, write_state
from osfl.flower.spec import JOBS, JobBuilder, JobSpec

__all__ = ["add_secure_train", "error_reply_mod", "secure_vector"]

log = logging.getLogger(__name__)


def secure_vector(
    upload: Upload, plan: QuantizationPlan, *, client: int
) -> tuple[list[np.ndarray], int]:
    """The arrays (sorted by name, divided by their scale, float64, flat) and
    the weight a client hands to Flower's mod; refused (the client drops out)
    where the mod would corrupt the sum silently: another tensor set, a weight
    outside ``[1, max_weight]``, a non-finite or clipped value.

    Flat because Flower 1.41's server drops the offset and the division for a
    0-d array (``secaggplus_workflow.py`` lines 648-650 update ``vec`` in
    place, but ``dequantize`` returns a NumPy *scalar* for a 0-d array, so the
    loop only rebinds its variable): BatchNorm's ``num_batches_tracked``
    would come back as garbage."""
    n = SECURE_WEIGHTINGS.get(plan.weighting).weight(upload)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= plan.max_weight:
        raise UploadError(
            f"its {plan.weighting} weight {n!r} must be an integer in [1, max_weight="
            f"{plan.max_weight}]",
            client=client,
            field="meta.num_samples",
        )
    if sorted(upload.tensors) != list(plan.scales):
        raise UploadError("the upload's tensors are not the round's layout", client=client)
    weight = n / plan.max_weight  # what the mod multiplies by (exact: m is a power of two)
    arrays = []
    for name, scale in plan.scales.items():
        a = upload.tensors[name].detach().to("cpu", torch.float64).numpy() / scale
        if not np.isfinite(a).all():
            raise UploadError("is not finite", client=client, field=name)
        peak = weight * float(np.abs(a).max(initial=0.0))
        if peak > plan.clipping_range:
            raise UploadError(
                f"(weight / max_weight) * |value| reaches {peak:.4g}, beyond SecAgg+'s "
                f"clipping_range {plan.clipping_range:g}; raise secagg.clipping_range",
                client=client,
                field=name,
            )
        arrays.append(a.reshape(-1))
    return arrays, n


def error_reply_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Outermost mod: a failure below (the client step or Flower's mod) becomes
    an error reply, which SecAgg+ counts as a dropout, not a crashed node."""
    try:
        return call_next(msg, context)
    except Exception as e:  # the server must hear of it; this node's log keeps the trace
        log.warning("secure train step failed: %s", e, exc_info=not isinstance(e, UploadError))
        return Message(Error(ERROR_CLIENT_FAILED, f"{type(e).__name__}: {e}"), reply_to=msg)


def _check_addressed(cfg: Mapping[str, Any], pid: int) -> None:
    """Refuse a FitIns addressed to another client: a node trains only the
    partition it plays."""
    if cfg.get(SecureKey.CLIENT) != pid:
        raise UploadError(
            f"the server addressed client {cfg.get(SecureKey.CLIENT)} to this node, which "
            f"is partition-id {pid}",
            client=pid,
        )


def _check_job(cfg: Mapping[str, Any], digest: str) -> None:
    """Refuse a round of another job: the node and the server must build the
    same job (config, data, seed) for the masked sum to mean anything."""
    if cfg.get(SecureKey.JOB) != digest:
        raise ConfigError(
            f"this node built job {digest} but the server runs job "
            f"{cfg.get(SecureKey.JOB)}: start the run and the SuperNodes with the same osfl "
            "config, data and seed"
        )


def _round_of(cfg: Mapping[str, Any], pid: int) -> int:
    """The round the FitIns names, an int (a bool is refused, though Python
    counts it one)."""
    round = cfg.get(SecureKey.ROUND)
    if not isinstance(round, int) or isinstance(round, bool):
        raise UploadError(f"the FitIns names no round ({round!r})", client=pid)
    return round


def _state_before(context: Context, state_file: Path | None, pid: int) -> bytes | None:
    """The node's state as the plain handler keeps it: ``Context.state``,
    else its state file (a node restarted between server runs)."""
    before = read_state(context.state, client=pid)
    if before is None and state_file is not None and state_file.is_file():
        before = state_file.read_bytes()
    return before


def add_secure_train(app: ClientApp, builder: JobBuilder, spec: JobSpec | None = None) -> ClientApp:
    """Register SecAgg+'s handler on the osfl ClientApp ``app`` (built by
    ``make_client_app`` with the same ``builder`` and ``spec``): message type
    ``"train"`` inside ``secaggplus_mod``, which answers the key stages itself
    and calls the handler in its masked-vector stage. Harmless for plain runs:
    their messages (``train.osfl_update``) never reach it."""

    def secure_update(msg: Message, context: Context) -> Message:
        pid = partition_id(context)
        fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
        cfg = fitins.config
        _check_addressed(cfg, pid)
        base = spec or JobSpec.from_run_config(context.run_config)
        job, digest = JOBS.get(builder, base.with_node(context.node_config))
        _check_job(cfg, digest)
        params = fitins.parameters
        if params.tensor_type != BROADCAST_TENSOR_TYPE or len(params.tensors) != 1:
            raise UploadError("the FitIns carries no osfl broadcast", client=pid)
        plan = QuantizationPlan.from_json(cfg.get(SecureKey.PLAN), client=pid)
        round = _round_of(cfg, pid)
        state_file = _state_file(context, digest, pid)
        before = _state_before(context, state_file, pid)
        turn = run_client(
            job.method,
            job.run,
            client=pid,
            round=round,
            seed=job.seed,
            payload=params.tensors[0],
            data=job.clients.data(pid),
            state=before,
        )
        if turn.upload is None:
            raise UploadError(turn.failure or "no upload", client=pid)
        upload = Upload.from_bytes(turn.upload, client=pid)
        arrays, weight = secure_vector(upload, plan, client=pid)
        write_state(context.state, turn.state)
        if state_file is not None and turn.state is not None:
            _write_atomically(state_file, turn.state)
        layout = {n: (tuple(t.shape), t.dtype) for n, t in upload.tensors.items()}
        res = FitRes(
            status=Status(Code.OK, ""),
            parameters=Parameters([ndarray_to_bytes(a) for a in arrays], "numpy.ndarray"),
            num_examples=weight,
            metrics={
                SecureKey.ROUND: round,
                SecureKey.CLIENT: pid,
                SecureKey.JOB: digest,
                SecureKey.LAYOUT: layout_digest(layout),
                SecureKey.NOTES: json.dumps(list(turn.warnings)),
            },
        )
        return Message(compat.fitres_to_recorddict(res, keep_input=False), reply_to=msg)

    app.train(mods=[error_reply_mod, secaggplus_mod])(secure_update)
    return app
