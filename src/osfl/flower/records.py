"""How an osfl :class:`~osfl.fl.upload.Broadcast` / :class:`~osfl.fl.upload.Upload`
rides inside a Flower ``Message`` (Flower's Message API, ``flwr.app``).

A message's :class:`flwr.app.RecordDict` holds two records:

- ``"osfl.payload"``: an :class:`flwr.app.ArrayRecord` with one
  :class:`flwr.app.Array` named ``"safetensors"`` whose ``data`` is the exact
  ``Broadcast.to_bytes()`` / ``Upload.to_bytes()`` (``dtype="uint8"``,
  ``shape=(nbytes,)``, ``stype="safetensors"``). An ArrayRecord rather than
  a bytes value in a ConfigRecord because Flower splits arrays into chunks
  (``FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE``, 5 MiB) on the wire, so a ResNet
  upload travels like any Flower model; the bytes are carried unchanged, so
  the byte accounting is the same number the simulation reports.
- ``"osfl.meta"``: a :class:`flwr.app.ConfigRecord` with ``round`` (int),
  ``client`` (the client id the server assigned to that node, checked by the
  node against its own ``partition-id``) and ``job`` (a digest of what both
  sides built: data, partition, model, training recipe, method, seed — see
  :func:`osfl.fl.runtime.identity.job_digest`), so a node started with a
  different config is refused instead of silently training on other data.

A client's :class:`~osfl.fl.context.ClientState` between rounds lives in the
SuperNode's ``Context.state`` (Flower's per-node state, kept across the
messages of one run) as the same kind of record: the state's safetensors
bytes in an ArrayRecord named ``"osfl.client_state"``.

Nothing here is pickled: safetensors bytes and scalars only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from osfl import jsonio
from osfl.errors import UploadError

PAYLOAD_RECORD = "osfl.payload"
META_RECORD = "osfl.meta"
PAYLOAD_ARRAY = "safetensors"
PAYLOAD_STYPE = "safetensors"
STATE_RECORD = "osfl.client_state"
WHOAMI_RECORD = "osfl.whoami"
QUERY_RECORD = "osfl.query"
SCORE_RECORD = "osfl.score"

#: Flower message types (``<category>.<action>``) the osfl ClientApp answers.
MSG_WHOAMI = "query.osfl_whoami"
MSG_TRAIN = "train.osfl_update"
MSG_EVALUATE = "evaluate.osfl_evaluate"
MSG_OWN_MODEL = "evaluate.osfl_own_model"


@dataclass(frozen=True)
class Envelope:
    """A payload (safetensors bytes) and who/when it is for; a client's reply
    may carry ``notes`` (its local training's warnings, for the run's record)."""

    payload: bytes
    round: int
    client: int
    job: str
    notes: tuple[str, ...] = ()


def _bytes_record(data: bytes) -> ArrayRecord:
    arr = Array(dtype="uint8", shape=(len(data),), stype=PAYLOAD_STYPE, data=bytes(data))
    return ArrayRecord({PAYLOAD_ARRAY: arr})


def _record_bytes(record: ArrayRecord, name: str, client: int | str | None) -> bytes:
    arr = record.get(PAYLOAD_ARRAY)
    if arr is None or arr.stype != PAYLOAD_STYPE or arr.dtype != "uint8":
        raise UploadError(
            f"record {name!r} must hold a uint8 {PAYLOAD_STYPE} array named {PAYLOAD_ARRAY!r}",
            client=client,
            field=PAYLOAD_ARRAY,
        )
    return bytes(arr.data)


def pack(env: Envelope) -> RecordDict:
    """An :class:`Envelope` as a Flower RecordDict (see the module docstring)."""
    return RecordDict(
        {
            PAYLOAD_RECORD: _bytes_record(env.payload),
            META_RECORD: ConfigRecord(
                {
                    "round": int(env.round),
                    "client": int(env.client),
                    "job": str(env.job),
                    "notes": json.dumps(list(env.notes)),
                }
            ),
        }
    )


def unpack(content: RecordDict, *, client: int | str | None = None) -> Envelope:
    """The :class:`Envelope` in a RecordDict; a malformed one is an UploadError
    naming ``client`` and the missing field."""
    arrays = content.array_records.get(PAYLOAD_RECORD)
    meta = content.config_records.get(META_RECORD)
    if arrays is None or meta is None:
        missing = PAYLOAD_RECORD if arrays is None else META_RECORD
        raise UploadError(f"Flower message lacks the {missing!r} record", client=client)
    payload = _record_bytes(arrays, PAYLOAD_RECORD, client)
    for key, kind in (("round", int), ("client", int), ("job", str)):
        value = meta.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise UploadError(
                f"{META_RECORD}.{key} must be a {kind.__name__}", client=client, field=key
            )
    return Envelope(
        payload=payload,
        round=int(meta["round"]),
        client=int(meta["client"]),
        job=str(meta["job"]),
        notes=_notes(meta.get("notes"), client),
    )


def _notes(raw: Any, client: int | str | None) -> tuple[str, ...]:
    """A reply's notes: a JSON list of at most 20 short strings, else refused."""
    if raw is None:
        return ()
    try:
        notes = jsonio.loads(str(raw), max_depth=2, max_chars=20 * 600)
    except ValueError as e:
        raise UploadError(f"{META_RECORD}.notes is not JSON: {e}", client=client) from e
    if not isinstance(notes, list) or len(notes) > 20 or not all(isinstance(n, str) for n in notes):
        raise UploadError(
            f"{META_RECORD}.notes must be a list of at most 20 strings", client=client
        )
    return tuple(n[:500] for n in notes)


def whoami_query(job: str, parts: Mapping[str, Any]) -> RecordDict:
    """The server's discovery query: its job digest and the parts behind it
    (JSON), so that a node whose job differs can say *what* differs."""
    return RecordDict(
        {QUERY_RECORD: ConfigRecord({"job": job, "parts": json.dumps(parts, sort_keys=True)})}
    )


def read_whoami_query(content: RecordDict) -> tuple[str, dict[str, Any]]:
    """``(job digest, job parts)`` of a discovery query."""
    rec = content.config_records.get(QUERY_RECORD)
    if rec is None or not isinstance(rec.get("job"), str):
        raise UploadError(f"discovery query lacks {QUERY_RECORD}.job")
    try:
        parts = jsonio.loads(str(rec.get("parts", "{}")))
    except ValueError as e:
        raise UploadError(f"discovery query: {QUERY_RECORD}.parts is not JSON: {e}") from e
    return str(rec["job"]), parts if isinstance(parts, dict) else {}


def whoami_record(partition_id: int, job: str) -> RecordDict:
    """A node's answer to the server's discovery query: which client it plays
    (its ``partition-id``) and the digest of the job it built."""
    return RecordDict(
        {WHOAMI_RECORD: ConfigRecord({"partition-id": int(partition_id), "job": job})}
    )


def read_whoami(content: RecordDict) -> tuple[int, str]:
    """``(partition_id, job digest)`` from a discovery reply."""
    rec = content.config_records.get(WHOAMI_RECORD)
    if rec is None or not isinstance(rec.get("partition-id"), int):
        raise UploadError(f"discovery reply lacks {WHOAMI_RECORD}.partition-id")
    return int(rec["partition-id"]), str(rec.get("job", ""))


def read_state(state: RecordDict, *, client: int | None = None) -> bytes | None:
    """The client state a node keeps in its ``Context.state`` (``None`` before
    its first round)."""
    record = state.array_records.get(STATE_RECORD)
    return None if record is None else _record_bytes(record, STATE_RECORD, client)


def write_state(state: RecordDict, data: bytes | None) -> None:
    """Keep ``data`` (a serialised client state) in the node's ``Context.state``."""
    if data is not None:
        state[STATE_RECORD] = _bytes_record(data)


def score_record(client: int, job: str, score: Mapping[str, Any]) -> RecordDict:
    """A node's evaluation (JSON): a site's counts for the released model, or a
    client's metrics of its own model."""
    return RecordDict(
        {
            SCORE_RECORD: ConfigRecord(
                {"client": int(client), "job": job, "score": json.dumps(dict(score))}
            )
        }
    )


def read_score(content: RecordDict, *, client: int) -> tuple[int, str, dict[str, Any]]:
    """``(client, job digest, score)`` of an evaluation reply; malformed: UploadError."""
    rec = content.config_records.get(SCORE_RECORD)
    if rec is None or not isinstance(rec.get("client"), int) or not isinstance(rec.get("job"), str):
        raise UploadError(f"evaluation reply lacks {SCORE_RECORD}", client=client)
    raw = rec.get("score")
    if not isinstance(raw, str) or len(raw) > 1_000_000:
        raise UploadError(f"{SCORE_RECORD}.score must be a JSON string", client=client)
    try:
        score = jsonio.loads(raw)
    except ValueError as e:
        raise UploadError(f"{SCORE_RECORD}.score is not JSON: {e}", client=client) from e
    if not isinstance(score, dict):
        raise UploadError(f"{SCORE_RECORD}.score must be a JSON object", client=client)
    return int(rec["client"]), str(rec["job"]), score
