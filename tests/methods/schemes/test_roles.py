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

from osfl.fl.upload import Upload
from support.by_hand import close, hand_run, make

COUNTS = {0: 5, 1: 40, 2: 12, 3: 90, 4: 27}
ARRIVAL = (3, 0, 4, 2, 1)


@pytest.mark.parametrize("missing", [0, 2, 4])
def test_each_kept_client_s_count_weighs_its_own_model(missing: int) -> None:
    method = make("scaffold", hand_run(), weighting="data_size")
    state = method.init_state()
    unusable = 1 if missing != 1 else 3
    uploads = {
        c: Upload(
            tensors={k: torch.full_like(v, float(c + 1)) for k, v in state.model.items()},
            meta={"num_samples": 0 if c == unusable else COUNTS[c]},
        )
        for c in ARRIVAL
        if c != missing
    }
    kept = sorted(c for c in COUNTS if c not in (missing, unusable))
    total = sum(COUNTS[c] for c in kept)
    want = sum(COUNTS[c] * (c + 1) for c in kept) / total
    arrival = [c for c in ARRIVAL if c in kept]
    misread = sum(COUNTS[a] * (c + 1) for a, c in zip(arrival, kept, strict=True)) / total
    assert abs(want - misread) > 0.1  # the pairing shows in the average
    new = method.aggregate(state, uploads, 1)
    for v in new.model.values():
        if v.is_floating_point():
            close(v, torch.full_like(v, want))
