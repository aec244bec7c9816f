"""EFTViT median sampling (§3.4): the threshold, minority classes drawn from
every epoch, majority classes from the last, counts ≤ m (exactly m with
padding), exact counts on a constructed client, and what the server can read."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from osfl.errors import ConfigError
from osfl.methods.eftvit import histogram_exposure, median_sample, plan_sampling
from osfl.methods.eftvit.sampling import sampling_threshold

# samples per class of a constructed client: 5 classes, one absent
COUNTS = [10, 2, 5, 0, 1]
EPOCHS = 3


def test_threshold_is_the_median_of_the_classes_the_client_holds() -> None:
    assert sampling_threshold(COUNTS) == 4  # median of [10, 2, 5, 1] = 3.5 -> 4
    assert sampling_threshold([7, 0, 3, 9]) == 7
    assert sampling_threshold([3, 0, 0]) == 3
    assert sampling_threshold(COUNTS, quantile=1.0) == 10  # Fig. 7: a higher threshold
    with pytest.raises(ConfigError):
        sampling_threshold([0, 0])


def test_plan_on_a_constructed_client() -> None:
    plan = plan_sampling(COUNTS, EPOCHS)
    assert plan.threshold == 4
    assert plan.minority == (False, True, False, False, True)
    assert plan.available == (10, 6, 5, 0, 3)  # minority: n_c · E
    assert plan.uploaded == (4, 4, 4, 0, 4)  # padded: every held class exactly m
    assert plan.num_features == 16
    unpadded = plan_sampling(COUNTS, EPOCHS, pad=False)
    assert unpadded.uploaded == (4, 4, 4, 0, 3)  # class 4 has only 1·3 features


def steps(counts: list[int], epochs: int) -> tuple[list, list, list]:
    """One step per epoch holding every sample once; a feature encodes
    (class, sample, epoch) so the test can tell where it came from."""
    feats, labels, eps = [], [], []
    for e in range(epochs):
        rows, ys = [], []
        for c, n in enumerate(counts):
            for i in range(n):
                rows.append([c, i, e])
                ys.append(c)
        feats.append(torch.tensor(rows, dtype=torch.float32)[:, None, :])  # N × 1 × 3
        labels.append(torch.tensor(ys))
        eps.append(e)
    return feats, labels, eps


@pytest.mark.parametrize("pad", [True, False])
def test_median_sample_invariants(pad: bool) -> None:
    feats, labels, eps = steps(COUNTS, EPOCHS)
    out, plan = median_sample(
        feats,
        labels,
        eps,
        COUNTS,
        num_epochs=EPOCHS,
        pad=pad,
        generator=torch.Generator().manual_seed(0),
    )
    assert sorted(out) == [0, 1, 2, 4]  # the absent class uploads nothing
    m = plan.threshold
    for c, f in out.items():
        tags = f[:, 0, :]
        assert (tags[:, 0] == c).all()  # every feature is of its own class
        assert len(f) == plan.uploaded[c] and len(f) <= m
        if pad:
            assert len(f) == m
        epochs_seen = set(tags[:, 2].long().tolist())
        if plan.minority[c]:
            pool = {(i, e) for i in range(COUNTS[c]) for e in range(EPOCHS)}
            got = {(int(i), int(e)) for i, e in tags[:, 1:].tolist()}
            assert got <= pool
            if len(pool) <= m:
                assert got == pool  # every feature of every epoch kept (then padded)
            assert len(epochs_seen) > 1  # drawn from all epochs, not only the last
        else:
            assert epochs_seen == {EPOCHS - 1}  # majority: last epoch only
            assert len(set(tags[:, 1].tolist())) == len(f)  # no repeats when downsampling
    assert len(out[1]) == 4 and len(out[4]) == (4 if pad else 3)


def test_median_sample_is_deterministic_per_generator() -> None:
    feats, labels, eps = steps(COUNTS, EPOCHS)
    kw = dict(num_epochs=EPOCHS, generator=torch.Generator().manual_seed(1))
    a, _ = median_sample(feats, labels, eps, COUNTS, **kw)
    kw["generator"] = torch.Generator().manual_seed(1)
    b, _ = median_sample(feats, labels, eps, COUNTS, **kw)
    assert all(torch.equal(a[c], b[c]) for c in a)


def test_what_the_server_reads_before_and_after_sampling() -> None:
    exp = histogram_exposure(COUNTS, EPOCHS)
    assert exp["before"] == COUNTS  # one feature per image: the histogram itself
    assert exp["after"] == [4, 4, 4, 0, 4]  # flat on the held classes
    assert exp["tv_before"] == 0.0
    p = np.array(COUNTS) / sum(COUNTS)
    assert exp["tv_after"] == pytest.approx(0.5 * np.abs(p - np.array([1, 1, 1, 0, 1]) / 4).sum())
    assert exp["tv_after"] > 0.2
    assert exp["support_disclosed"]  # which classes a client holds is still visible
    balanced = histogram_exposure([6, 6, 0], EPOCHS)
    assert balanced["tv_after"] == 0.0  # nothing to hide for a balanced client


def test_exposure_reports_the_threshold_and_the_unpadded_histogram_exactly() -> None:
    """Without padding a small class keeps its own count (here 1 of 2): the
    server then reads that class's true share, and a class with one sample
    still shows that the client holds it."""
    exp = histogram_exposure([2, 0, 1], 1, pad=False)
    assert exp == {"before": [2, 0, 1], "after": [2, 0, 1], "threshold": 2, "tv_before": 0.0,
                   "tv_after": 0.0, "support_disclosed": True}  # fmt: skip
    padded = histogram_exposure([2, 0, 1], 1)
    assert padded["after"] == [2, 0, 2] and padded["tv_after"] == pytest.approx(1 / 6)
    assert histogram_exposure(np.array([2.0, 0.0, 1.0]), 1, pad=False)["before"] == [2, 0, 1]
