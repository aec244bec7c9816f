"""One client's turn in one round, shared by every runtime.

The simulation calls :func:`run_client` in-process; the osfl ClientApp calls
it inside a Flower SuperNode (or a Ray actor). Both pass the broadcast and the
client's state as the bytes that would cross the wire or sit in Flower's
``Context.state``, and get bytes back, so the two runtimes cannot drift apart:
same seed, same data, same state in, same upload bytes out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from osfl.errors import UploadError
from osfl.fl.context import ClientContext, ClientState
from osfl.fl.method import Method, keeps_client_state, rounds_of
from osfl.fl.seeds import derive_seed
from osfl.fl.training import collect_training_warnings, record_step_labels, training_scope
from osfl.fl.upload import Broadcast

if TYPE_CHECKING:
    from osfl.data.imageset import ImageSet
    from osfl.fl.context import RunContext


def client_generator(seed: int, client: int, round: int) -> torch.Generator:
    """The generator a client uses in a round: a function of the seed only."""
    return torch.Generator().manual_seed(derive_seed(seed, "client", client, round))


def client_context(
    run: RunContext, *, client: int, round: int, seed: int, state: bytes | None = None
) -> ClientContext:
    """Client ``client``'s context in ``round``: its generator (a function of
    the seed) and its own state from earlier rounds."""
    own = ClientState.from_bytes(state, client=client) if state else ClientState()
    return ClientContext(
        run=run,
        client_id=client,
        round=round,
        generator=client_generator(seed, client, round),
        state=own,
    )


@dataclass
class ClientTurn:
    """What a client produced: its upload bytes (``None`` when it sent nothing,
    with the reason in ``failure``), its state for the next round, the labels
    its local steps used (the audits' ground truth; never sent), and its local
    training's warnings (a diverging loss, a client that did not learn)."""

    upload: bytes | None
    state: bytes | None
    failure: str | None = None
    step_labels: torch.Tensor | None = None
    warnings: tuple[str, ...] = ()  # what the client's local training said was wrong


def _check_state_declared(method: Method, state: ClientState) -> None:
    if (state.tensors or state.meta) and not keeps_client_state(method):
        raise TypeError(
            f"method {method.name!r} left client state ({sorted(state.tensors)}) but does not "
            "declare the KeepsClientState capability"
        )


def run_client(
    method: Method,
    run: RunContext,
    *,
    client: int,
    round: int,
    seed: int,
    payload: bytes,
    data: ImageSet,
    state: bytes | None = None,
) -> ClientTurn:
    """Parse the broadcast, run ``client_update`` with the client's state, and
    serialise the upload and the new state.

    An :class:`~osfl.errors.UploadError` while making or serialising the upload
    (e.g. metadata that is not JSON) means the client sends nothing and keeps
    its old state; any other error is raised. A method that leaves state in
    ``ctx.state`` without declaring :class:`~osfl.fl.method.KeepsClientState`
    is a bug in that method (a TypeError), not something to persist silently.
    """
    ctx = client_context(run, client=client, round=round, seed=seed, state=state)
    broadcast = Broadcast.from_bytes(payload, client=client)
    try:
        with (
            record_step_labels() as steps,
            collect_training_warnings() as warnings,
            training_scope(round, multi_round=rounds_of(method) > 1),
        ):
            upload = method.client_update(ctx, broadcast, data).to_bytes()
        _check_state_declared(method, ctx.state)
        new_state = ctx.state.to_bytes()
    except UploadError as e:
        return ClientTurn(upload=None, state=state, failure=str(e))
    labels = torch.cat([y.to("cpu") for y in steps]) if steps else None
    return ClientTurn(
        upload=upload, state=new_state, step_labels=labels, warnings=tuple(dict.fromkeys(warnings))
    )
