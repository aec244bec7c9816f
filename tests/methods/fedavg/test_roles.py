"""FedAvg roles: after the server keeps a subset of the uploads, each kept
client's ``n_k`` weighs that client's own weights (McMahan et al., AISTATS
2017, Alg. 1: ``w <- Σ_k n_k/n w_k``).

Every client sends a different constant model (its id + 1) and a different
sample count; the uploads arrive scrambled, one client is missing (refused
at the door) at the first, a middle or the last position, and one more has
an unusable count (dropped by ``sample_counts``). The average is worked out
by hand by client id, so a weight read by arrival order, or shifted by one
past a dropped client, gives another number.
"""

from __future__ import annotations

import pytest
import torch

from support.by_hand import close, hand_run, make, scrambled_uploads


@pytest.mark.parametrize("missing", [0, 2, 4])
def test_each_kept_client_s_count_weighs_its_own_model(missing: int) -> None:
    run = hand_run()
    method = make("fedavg", run)
    state = method.init_state()
    uploads, want = scrambled_uploads(state, missing)
    new = method.aggregate(state, uploads, 0)
    for v in new.values():
        if v.is_floating_point():
            close(v, torch.full_like(v, want))
