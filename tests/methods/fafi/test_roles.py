"""FAFI's median fusion pairs each client's class counts with that client's
prototypes, whatever order the server holds the clients in.

``fusion="median"`` selects, per class, the clients whose uploaded
``class_counts`` say they hold it, then takes the median (three holders or
more) or the mean (one or two) of *their* prototype rows
(``osfl.methods.fafi.fusion``, docs/methods/fafi.md). Here every client has
its own rows and its own holdings, the server's dict holds them in a
scrambled order (as a resumed state may), and one client is missing at the
first, a middle or the last position: counts read in the dict's order, or
a mean divided by every client instead of the holders, give other rows than
the ones computed here by hand.
"""

from __future__ import annotations

import pytest
import torch

from osfl.methods.fafi.config import FAFIConfig
from osfl.methods.fafi.inference import server_prototypes

#: client -> (prototypes C×D, class counts); every row different
CLIENTS = {
    0: ([[1.0, 0.0], [0.0, 0.0]], [4, 0]),
    1: ([[2.0, 1.0], [5.0, 3.0]], [3, 6]),
    2: ([[9.0, 9.0], [1.0, 7.0]], [0, 2]),
    3: ([[4.0, -1.0], [8.0, 8.0]], [5, 0]),
    4: ([[3.0, 2.0], [-2.0, 5.0]], [0, 3]),
}
HELD_ORDER = (3, 0, 4, 2, 1)


def _by_hand(kept: list[int], k: int) -> torch.Tensor:
    rows = torch.tensor([CLIENTS[c][0][k] for c in kept if CLIENTS[c][1][k] > 0])
    return rows.median(0).values if len(rows) >= 3 else rows.mean(0)


@pytest.mark.parametrize("missing", [0, 2, 4])
def test_median_fusion_reads_each_client_s_counts_with_its_own_rows(missing: int) -> None:
    clients = {
        c: {"prototypes": torch.tensor(CLIENTS[c][0]), "class_counts": CLIENTS[c][1]}
        for c in HELD_ORDER
        if c != missing
    }
    kept = sorted(clients)
    got = server_prototypes(FAFIConfig(fusion="median"), clients)
    want = torch.stack([_by_hand(kept, k) for k in range(2)])
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    held = [[c for c in kept if CLIENTS[c][1][k] > 0] for k in range(2)]
    assert any(len(h) >= 3 for h in held) and any(0 < len(h) < 3 for h in held)  # both rules
