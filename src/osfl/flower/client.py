"""The osfl ClientApp: a Flower ``ClientApp`` (Message API, ``flwr.clientapp``)
that runs a method's client side on this node's client data.

Each SuperNode plays one client of the federation: the one named by its node
config ``partition-id`` (``flower-supernode --node-config "partition-id=2"``;
Flower's simulation engine sets it to 0..N-1 itself). The node builds its
:class:`~osfl.fl.runtime.base.Job` from the run config with the app's builder,
so its client data is exactly the simulation's, and it runs the very client
step of the simulation (:func:`~osfl.fl.runtime.client.run_client`) with its
state from earlier rounds read from and written back to Flower's
``Context.state`` — same seed, same data, same state, same upload bytes.

Four handlers:

- ``query.osfl_whoami``: answers the server's discovery with the node's
  ``partition-id`` and the digest of the job it built.
- ``train.osfl_update``: checks the round's client id and job digest, runs the
  client step and replies with the Upload's safetensors bytes. A failure
  becomes a Flower error reply whose reason the server logs when it drops
  this client.
- ``evaluate.osfl_evaluate`` (real sites without a server test set): scores
  the method's released final state on this site's own test set and replies
  with counts (:class:`~osfl.fl.runtime.sites.SiteScore`).
- ``evaluate.osfl_own_model``: hands the broadcast and this client's
  ``Context.state`` (which never leaves the node) to the evaluation of
  clients' own models (:func:`~osfl.fl.own_models.score_client_predictor`,
  the simulation's very call) and replies with its metrics; the node only
  carries them.

At a real site (run config ``sites = true``) the node builds its job from its
own data (node config ``data``); with node config ``state-dir`` it also keeps
its client state in a file there, so that a restarted ServerApp (a new Flower
run, hence a fresh ``Context.state``) finds the state of the rounds before.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from flwr.app import Context, Error, Message
from flwr.clientapp import ClientApp

from osfl.errors import ConfigError, OsflError, UploadError
from osfl.fl.own_models import score_client_predictor
from osfl.fl.runtime.base import Job
from osfl.fl.runtime.client import run_client
from osfl.fl.runtime.sites import SiteData, score_at_site
from osfl.fl.state_codec import state_from_bytes
from osfl.flower.records import (
    MSG_EVALUATE,
    MSG_OWN_MODEL,
    MSG_TRAIN,
    MSG_WHOAMI,
    Envelope,
    pack,
    read_state,
    read_whoami_query,
    score_record,
    unpack,
    whoami_record,
    write_state,
)
from osfl.flower.spec import JOBS, JobBuilder, JobSpec, job_parts, parts_mismatch

log = logging.getLogger(__name__)

#: ``Error.code`` of a reply whose client refused or failed the work (Flower's
#: own codes are small integers; this one is osfl's).
ERROR_CLIENT_FAILED = 1001


def partition_id(context: Context) -> int:
    """This node's client id: its node config ``partition-id``."""
    value = context.node_config.get("partition-id")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            "this SuperNode has no integer node config 'partition-id': start it with "
            "flower-supernode --node-config 'partition-id=<client id>'"
        )
    return int(value)


Handler = Callable[[Message, Context], Message]


def _guarded(handler: Handler) -> Handler:
    """Turn a failure into an error reply that names this node's client,
    instead of Flower's generic 'ClientApp raised an exception'."""

    def wrapped(msg: Message, context: Context) -> Message:
        try:
            return handler(msg, context)
        except OsflError as e:
            log.warning("client refused %s: %s", msg.metadata.message_type, e)
            return Message(Error(ERROR_CLIENT_FAILED, str(e)), reply_to=msg)
        except Exception as e:  # a bug: keep its traceback in this node's log
            log.exception("client failed on %s", msg.metadata.message_type)
            return Message(Error(ERROR_CLIENT_FAILED, f"{type(e).__name__}: {e}"), reply_to=msg)

    return wrapped


def make_client_app(builder: JobBuilder, spec: JobSpec | None = None) -> ClientApp:
    """A ClientApp that builds its job with ``builder`` from ``spec`` (default:
    the run config of each message), once per process."""
    app = ClientApp()

    def job_for(context: Context) -> tuple[Job, str]:
        base = spec or JobSpec.from_run_config(context.run_config)
        return JOBS.get(builder, base.with_node(context.node_config))

    def checked(msg: Message, context: Context) -> tuple[int, Envelope, Job, str]:
        """This node's id, the message's envelope and the job, after checking
        that the message is for this node and this job."""
        pid = partition_id(context)
        env = unpack(msg.content, client=pid)
        if env.client != pid:
            raise UploadError(
                f"the server addressed client {env.client} to this node, which is "
                f"partition-id {pid}",
                client=pid,
            )
        job, digest = job_for(context)
        if env.job != digest:
            raise ConfigError(
                f"this node built job {digest} but the server runs job {env.job}: start "
                "the SuperLink run and the SuperNodes with the same osfl config, data and seed"
            )
        return pid, env, job, digest

    def whoami(msg: Message, context: Context) -> Message:
        pid = partition_id(context)
        job, digest = job_for(context)
        job.clients.data(pid)  # range check now, not in round 0
        theirs, parts = read_whoami_query(msg.content)
        if theirs != digest:
            raise ConfigError(
                f"partition-id {pid} built job {digest}, the server {theirs} "
                f"({parts_mismatch(job_parts(job), parts) or 'same parts, other digest'}): "
                "start the run and the SuperNodes with the same osfl version, config and data"
            )
        return Message(whoami_record(pid, digest), reply_to=msg)

    def update(msg: Message, context: Context) -> Message:
        pid, env, job, digest = checked(msg, context)
        state_file = _state_file(context, digest, pid)
        before = _kept_state(context, digest, pid)
        turn = run_client(
            job.method,
            job.run,
            client=pid,
            round=env.round,
            seed=job.seed,
            payload=env.payload,
            data=job.clients.data(pid),
            state=before,
        )
        if turn.upload is None:
            raise UploadError(turn.failure or "no upload", client=pid)
        write_state(context.state, turn.state)
        if state_file is not None and turn.state is not None:
            _write_atomically(state_file, turn.state)
        reply = Envelope(turn.upload, env.round, pid, digest, notes=turn.warnings)
        return Message(pack(reply), reply_to=msg)

    def evaluate(msg: Message, context: Context) -> Message:
        pid, env, job, digest = checked(msg, context)
        if not isinstance(job.clients, SiteData) or job.clients.test is None:
            raise ConfigError("only a real site (sites = true) evaluates the final model")
        predictor = job.method.predictor(state_from_bytes(env.payload))
        score = score_at_site(predictor, job.clients.test, job.run.eval_transform, job.run.device)
        return Message(score_record(pid, digest, score.as_meta()), reply_to=msg)

    def score_at_node(msg: Message, context: Context) -> Message:
        pid, env, job, digest = checked(msg, context)
        score = score_client_predictor(
            job.method,
            job.evaluator,
            client=pid,
            payload=env.payload,
            state=_kept_state(context, digest, pid),
        )
        return Message(score_record(pid, digest, score), reply_to=msg)

    app.query(MSG_WHOAMI.partition(".")[2])(_guarded(whoami))
    app.train(MSG_TRAIN.partition(".")[2])(_guarded(update))
    app.evaluate(MSG_EVALUATE.partition(".")[2])(_guarded(evaluate))
    app.evaluate(MSG_OWN_MODEL.partition(".")[2])(_guarded(score_at_node))
    return app


def _state_file(context: Context, digest: str, pid: int) -> Path | None:
    """Where this node keeps its client state between server runs (node
    config ``state-dir``), or ``None``."""
    root = context.node_config.get("state-dir")
    if not isinstance(root, str) or not root:
        return None
    return Path(root) / f"{digest}-client{pid}.safetensors"


def _kept_state(context: Context, digest: str, pid: int) -> bytes | None:
    """This client's state: its ``Context.state``, else its ``state-dir`` file
    (kept on disk across a server restart), else ``None``."""
    before = read_state(context.state, client=pid)
    state_file = _state_file(context, digest, pid)
    if before is None and state_file is not None and state_file.is_file():
        before = state_file.read_bytes()
    return before


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
