"""Tests for osfl.data.partition / federation / plot: exact invariants of every
scheme, refusal of bad parameters, JSON round trip, cache, heat map."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from osfl.data import partition as partition_mod
from osfl.data.federation import Federation
from osfl.data.partition import PARTITIONS, QuantitySkew, make_federation
from osfl.data.plot import plot_class_counts
from osfl.errors import DataError

N, K, D = 600, 10, 3
_rng = np.random.default_rng(1234)
LABELS = _rng.integers(0, K, N)
DOMAINS = _rng.integers(0, D, N)

# scheme name -> (num_clients, params); every registered scheme must appear here.
CASES: dict[str, tuple[int, dict]] = {
    "iid": (7, {}),
    "dirichlet": (8, {"alpha": 0.3}),
    "pathological": (12, {"classes_per_client": 3, "class_assignment": "first-deterministic"}),
    "natural_id": (D, {}),
    "quantity_skew": (6, {"beta": 0.5}),
}


def _make(scheme: str, seed: int = 0, **extra):
    n, params = CASES[scheme]
    return make_federation(LABELS, scheme, n, seed, domains=DOMAINS, **{**params, **extra})


def _same_indices(a: Federation, b: Federation) -> bool:
    return len(a.client_indices) == len(b.client_indices) and all(
        np.array_equal(x, y) for x, y in zip(a.client_indices, b.client_indices, strict=True)
    )


def _assigned_count(fed: Federation) -> np.ndarray:
    hits = np.zeros(N, dtype=np.int64)
    for a in fed.client_indices:
        np.add.at(hits, a, 1)
    return hits


def test_every_scheme_has_a_case():
    assert set(PARTITIONS.names()) == set(CASES)


@pytest.mark.parametrize("scheme", sorted(CASES))
def test_every_sample_exactly_once_and_counts(scheme):
    fed = _make(scheme)
    assert fed.num_clients == CASES[scheme][0] == len(fed.client_indices)
    # these cases use every sample exactly once (pathological: first-deterministic with
    # num_clients >= classes, so every class is held by some client)
    assert np.array_equal(_assigned_count(fed), np.ones(N, dtype=np.int64))
    assert fed.class_counts.shape == (fed.num_clients, K)
    assert np.array_equal(fed.class_counts.sum(axis=1), fed.sizes)
    for c, idx in enumerate(fed.client_indices):
        assert idx.dtype == np.int64
        assert np.all(np.diff(idx) > 0)  # sorted, no duplicates
        assert np.array_equal(fed.class_counts[c], np.bincount(LABELS[idx], minlength=K))
    assert fed.sizes.sum() == N


@pytest.mark.parametrize("scheme", sorted(CASES))
def test_deterministic_for_a_seed_and_seeds_differ(scheme):
    a, b = _make(scheme, seed=3), _make(scheme, seed=3)
    assert a == b and a.key() == b.key()
    c = _make(scheme, seed=4)
    assert c != a and c.key() != a.key()
    # one client per domain: the seed is recorded but cannot change who holds what
    assert _same_indices(a, c) == (scheme == "natural_id")


def test_iid_sizes_worked_by_hand():
    # datasets' contiguous shards: N=10 into 3 -> the first shard takes the remainder
    fed = make_federation(np.arange(10) % 2, "iid", 3, 0)
    assert fed.sizes.tolist() == [4, 3, 3]


def test_accepts_torch_labels_and_gives_same_result():
    a = make_federation(torch.as_tensor(LABELS), "dirichlet", 5, 1, alpha=0.5)
    b = make_federation(LABELS, "dirichlet", 5, 1, alpha=0.5)
    assert a == b


def test_defaults_are_recorded_and_key_ignores_how_they_were_given():
    a = make_federation(LABELS, "dirichlet", 5, 1, alpha=0.5)
    b = make_federation(LABELS, "dirichlet", 5, 1, alpha=0.5, min_partition_size=2)
    assert a.params == {"alpha": 0.5, "min_partition_size": 2, "self_balancing": False}
    assert a.key() == b.key()


def test_pathological_random_at_most_k_classes_and_unused_classes_left_out():
    k = 2
    fed = make_federation(LABELS, "pathological", 4, 5, classes_per_client=k)
    assert np.all(fed.classes_per_client() == k)  # exactly k (so at most k)
    held = np.flatnonzero(fed.class_counts.sum(axis=0) > 0)
    hits = _assigned_count(fed)
    in_held = np.isin(LABELS, held)
    assert np.all(hits[in_held] == 1) and np.all(hits[~in_held] == 0)


def test_pathological_deterministic_classes_by_hand():
    # 'deterministic': client c holds classes (c + i) mod K, i < k
    fed = make_federation(LABELS, "pathological", 4, 0, classes_per_client=2,
                          class_assignment="deterministic")  # fmt: skip
    for c in range(4):
        assert set(np.flatnonzero(fed.class_counts[c])) == {c % K, (c + 1) % K}


def test_natural_id_one_domain_per_client():
    fed = _make("natural_id")
    for c, idx in enumerate(fed.client_indices):
        assert set(DOMAINS[idx].tolist()) == {c}
        assert len(idx) == int(np.bincount(DOMAINS)[c])


def test_natural_id_with_alpha_splits_each_domain():
    fed = make_federation(LABELS, "natural_id", 2 * D, 0, domains=DOMAINS, alpha=0.5)
    assert np.array_equal(_assigned_count(fed), np.ones(N, dtype=np.int64))
    for c, idx in enumerate(fed.client_indices):
        assert set(DOMAINS[idx].tolist()) == {c // 2}
        assert len(idx) >= 2
    explicit = make_federation(LABELS, "natural_id", 2 * D, 0, domains=DOMAINS, alpha=0.5,
                               clients_per_domain=2)  # fmt: skip
    assert _same_indices(explicit, fed)
    other = make_federation(LABELS, "natural_id", 2 * D, 1, domains=DOMAINS, alpha=0.5)
    assert not _same_indices(other, fed)


def test_quantity_skew_sizes():
    q = QuantitySkew(beta=0.5, min_partition_size=3)
    for seed in range(5):
        sizes = q.sizes(100, 7, seed)
        assert sum(sizes) == 100 and min(sizes) >= 3
    fed = make_federation(LABELS, "quantity_skew", 6, 0, beta=0.5, min_partition_size=20)
    assert fed.sizes.min() >= 20 and fed.sizes.sum() == N
    # small beta -> sizes far more unequal than large beta
    cv = lambda b: np.mean([np.std(s) / np.mean(s) for s in  # noqa: E731
                            (QuantitySkew(beta=b).sizes(5000, 10, s) for s in range(10))])  # fmt: skip
    assert cv(0.1) > 3 * cv(100.0)


def _classes_for_90pct(fed: Federation) -> float:
    out = []
    for row in fed.class_counts:
        frac = np.cumsum(np.sort(row)[::-1]) / row.sum()
        out.append(int(np.searchsorted(frac, 0.9 - 1e-12) + 1))
    return float(np.mean(out))


def test_small_alpha_is_visibly_skewed():
    labels = np.repeat(np.arange(10), 200)
    skewed = make_federation(labels, "dirichlet", 10, 0, alpha=0.1)
    flat = make_federation(labels, "dirichlet", 10, 0, alpha=100.0)
    assert _classes_for_90pct(skewed) <= 3.5
    assert _classes_for_90pct(flat) >= 8.0


# ---- bad parameters --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("scheme", "n", "params", "match"),
    [
        ("dirichlet", 4, {"alpha": 0}, "alpha must be > 0"),
        ("dirichlet", 4, {"alpha": -1.0}, "alpha must be > 0"),
        ("dirichlet", 4, {"alpha": float("nan")}, "finite"),
        ("dirichlet", 4, {"alpha": "big"}, "finite"),
        ("pathological", 4, {"classes_per_client": 11}, "classes_per_client <= 10"),
        (
            "pathological",
            4,
            {"classes_per_client": 0},
            "classes_per_client must be an integer >= 1",
        ),
        ("pathological", 4, {"class_assignment": "roundrobin"}, "class_assignment must be one of"),
        ("iid", N + 1, {}, "more than the 600 samples"),
        ("iid", 0, {}, "num_clients must be an integer >= 1"),
        ("nosuchscheme", 4, {}, "valid: dirichlet, iid, natural_id, pathological, quantity_skew"),
        ("dirichlet", 4, {"beta": 1.0}, "unknown parameter"),
        ("quantity_skew", 4, {"beta": 0.0}, "beta must be > 0"),
        (
            "dirichlet",
            20,
            {"min_partition_size": 31},
            "fewer clients or a smaller min_partition_size",
        ),
        ("quantity_skew", 20, {"min_partition_size": 31}, "needs 620 samples"),
    ],
)
def test_bad_parameters_refused(scheme, n, params, match):
    with pytest.raises(DataError, match=match):
        make_federation(LABELS, scheme, n, 0, **params)


def test_natural_id_needs_domains_and_matching_clients():
    with pytest.raises(DataError, match="natural_id needs a domain per sample"):
        make_federation(LABELS, "natural_id", D, 0)
    with pytest.raises(DataError, match=f"set num_clients={D}"):
        make_federation(LABELS, "natural_id", D + 1, 0, domains=DOMAINS)
    with pytest.raises(DataError, match="set num_clients=6"):
        make_federation(
            LABELS, "natural_id", 7, 0, domains=DOMAINS, alpha=1.0, clients_per_domain=2
        )
    with pytest.raises(DataError, match="set alpha"):
        make_federation(LABELS, "natural_id", 6, 0, domains=DOMAINS, clients_per_domain=2)


def test_dirichlet_unreachable_min_size_ends_with_clear_error():
    # possible in principle (10 x 40 <= 600) but alpha=0.01 puts each class on ~1
    # client: Flower retries a bounded number of times, we re-raise as DataError
    with pytest.raises(
        DataError, match="larger alpha, fewer clients or a smaller min_partition_size"
    ):
        make_federation(LABELS, "dirichlet", 10, 0, alpha=0.01, min_partition_size=40)


def test_bad_labels_seed_and_num_classes():
    with pytest.raises(DataError, match="1-D"):
        make_federation(LABELS.reshape(2, -1), "iid", 2, 0)
    with pytest.raises(DataError, match="integers"):
        make_federation(LABELS + 0.5, "iid", 2, 0)
    with pytest.raises(DataError, match=">= 0"):
        make_federation(LABELS - 1, "iid", 2, 0)
    with pytest.raises(DataError, match="seed must be an integer >= 0"):
        make_federation(LABELS, "iid", 2, -1)
    with pytest.raises(DataError, match="labels go up to 9"):
        make_federation(LABELS, "iid", 2, 0, num_classes=5)
    fed = make_federation(LABELS, "iid", 2, 0, num_classes=12)
    assert fed.class_counts.shape == (2, 12) and fed.class_counts[:, 10:].sum() == 0


# ---- JSON, key, cache -----------------------------------------------------------------------
@pytest.mark.parametrize("scheme", sorted(CASES))
def test_json_round_trip(scheme, tmp_path):
    fed = _make(scheme)
    path = fed.save_json(tmp_path / "fed.json")
    back = Federation.load_json(path)
    assert back == fed and back.key() == fed.key()
    assert back.summary() == fed.summary()


def _corrupt(tmp_path, edit):
    fed = make_federation(LABELS, "dirichlet", 4, 0, alpha=1.0)
    d = json.loads(fed.save_json(tmp_path / "f.json").read_text())
    edit(d)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda d: d.pop("seed"), "field 'seed'"),
        (lambda d: d.update(format="pickle"), "not an osfl.federation"),
        (lambda d: d["client_indices"][0].append(N), "outside"),
        (lambda d: d["client_indices"][1].insert(0, d["client_indices"][0][0]), "another client"),
        (lambda d: d["client_indices"][0].__setitem__(0, "x"), "not a list of integers"),
        (
            lambda d: d["class_counts"][0].__setitem__(0, d["class_counts"][0][0] + 1),
            "class counts sum",
        ),
        (lambda d: d.update(seed=d["seed"] + 1), "stored key does not match"),
        (lambda d: d.update(num_clients=5), "num_clients=5"),
    ],
)
def test_load_refuses_malformed(tmp_path, edit, match):
    with pytest.raises(DataError, match=match):
        Federation.load_json(_corrupt(tmp_path, edit))


def test_load_refuses_non_json_and_missing(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        Federation.load_json(p)
    with pytest.raises(DataError, match="does not exist"):
        Federation.load_json(tmp_path / "missing.json")


def test_cache_returns_same_without_recomputing(tmp_path, monkeypatch):
    first = make_federation(LABELS, "dirichlet", 5, 2, alpha=0.2, cache_dir=tmp_path)
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1 and first.recipe_key() in files[0].name

    def boom(*a, **k):
        raise AssertionError("recomputed despite the cache")

    monkeypatch.setattr(partition_mod, "_compute", boom)
    again = make_federation(LABELS, "dirichlet", 5, 2, alpha=0.2, cache_dir=tmp_path)
    assert again == first
    with pytest.raises(AssertionError, match="recomputed"):  # other params: a cache miss
        make_federation(LABELS, "dirichlet", 5, 2, alpha=0.3, cache_dir=tmp_path)
    with pytest.raises(AssertionError, match="recomputed"):  # other labels: a cache miss
        make_federation(LABELS[::-1].copy(), "dirichlet", 5, 2, alpha=0.2, cache_dir=tmp_path)


def test_corrupt_cache_entry_is_recomputed(tmp_path):
    first = make_federation(LABELS, "iid", 3, 0, cache_dir=tmp_path)
    (path,) = tmp_path.glob("*.json")
    path.write_text("garbage")
    assert make_federation(LABELS, "iid", 3, 0, cache_dir=tmp_path) == first
    assert Federation.load_json(path) == first


def test_check_labels():
    fed = make_federation(LABELS, "iid", 3, 0)
    fed.check_labels(torch.as_tensor(LABELS))
    with pytest.raises(DataError, match="made for other labels"):
        fed.check_labels(LABELS[::-1].copy())


def test_summary_and_immutability():
    fed = make_federation(LABELS, "pathological", 4, 0, classes_per_client=2,
                          class_assignment="deterministic")  # fmt: skip
    s = fed.summary()
    assert s["classes_per_client"] == [2, 2, 2, 2]
    assert s["sizes"] == fed.sizes.tolist() and s["assigned_samples"] == sum(s["sizes"])
    json.dumps(s)
    with pytest.raises(ValueError):
        fed.client_indices[0][0] = 1


# ---- plot -------------------------------------------------------------------------------------
def test_plot_writes_png(tmp_path):
    fed = _make("dirichlet")
    path = plot_class_counts(
        fed, tmp_path / "sub" / "heat.png", class_names=[f"c{i}" for i in range(K)]
    )
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000
    with pytest.raises(DataError, match="one name per class"):
        plot_class_counts(fed, tmp_path / "x.png", class_names=["a"])
