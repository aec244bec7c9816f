"""The schemes' server step pairs each kept client's weight with that
client's own model (``SchemeMethod.aggregate``: ``sample_counts``, then the
ids in order, then ``weighting``).

SCAFFOLD with ``weighting=data_size`` and ``server_lr=1``: the new global
model is ``Σ_k n_k w_k / Σ n`` over the uploads the server kept. Every client
sends a different constant model and sample count, the uploads arrive
scrambled, one client is missing (refused at the door) at the first, a
middle or the last position and one more has an unusable count: the
average is worked out by hand by client id.
"""

from __future__ import annotations

import pytest
import torch

from support.by_hand import close, hand_run, make, scrambled_uploads


@pytest.mark.parametrize("missing", [0, 2, 4])
def test_each_kept_client_s_count_weighs_its_own_model(missing: int) -> None:
    method = make("scaffold", hand_run(), weighting="data_size")
    state = method.init_state()
    uploads, want = scrambled_uploads(state.model, missing)
    new = method.aggregate(state, uploads, 1)
    for v in new.model.values():
        if v.is_floating_point():
            close(v, torch.full_like(v, want))
