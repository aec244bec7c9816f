"""Real sites over Flower (loopback): each site reads only its own image
folder (node config ``data``), the server holds no client data, class names
are agreed by the config (a site with a foreign class is refused before
training, naming it), and without a server test set the sites score the
released final model and the server adds up their counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from osfl import site_assembly
from osfl.config import load_config, to_yaml
from osfl.data.sources import load_data
from osfl.errors import ConfigError, DataError
from osfl.fl.runtime.sites import NoClientData, Site, SiteRegistry, SiteScore, merge_site_scores
from osfl.flower.client import make_client_app
from osfl.flower.loopback import FIRST_NODE_ID, LoopbackGrid, loopback_identity
from osfl.flower.spec import JobSpec
from osfl.flower_app.apps import serve_experiment
from support.tiny import TINY_GREY

CLASSES = [str(i) for i in range(10)]
#: Each site's classes (non-IID: site 2 holds four of the ten).
SITE_CLASSES = [CLASSES, CLASSES[:7], CLASSES[3:7]]


def _write_folder(root: Path, images: np.ndarray, labels: np.ndarray, keep: list[str]) -> None:
    for i, (img, y) in enumerate(zip(images, labels, strict=True)):
        name = CLASSES[int(y)]
        if name not in keep:
            continue
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img[0]).save(d / f"{i}.png")


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> Path:
    """Three site folders (train/ and test/) cut from the digits, plus one
    site with a class outside the agreed ten."""
    root = tmp_path_factory.mktemp("sites")
    splits = load_data("digits", image_size=8, max_per_class=60)
    tr, te = splits.train, splits.test
    n_tr, n_te = len(tr), len(te)
    for s, keep in enumerate(SITE_CLASSES):
        part_tr = np.arange(s, n_tr, 3)
        part_te = np.arange(s, n_te, 3)
        _write_folder(
            root / f"site{s}" / "train",
            tr.images[part_tr].numpy(),
            tr.labels[part_tr].numpy(),
            keep,
        )
        _write_folder(
            root / f"site{s}" / "test", te.images[part_te].numpy(), te.labels[part_te].numpy(), keep
        )
    _write_folder(
        root / "server" / "train", tr.images[:20].numpy(), tr.labels[:20].numpy(), CLASSES
    )
    _write_folder(root / "server" / "test", te.images.numpy(), te.labels.numpy(), CLASSES)
    odd = root / "odd"
    _write_folder(odd / "train", tr.images[:40].numpy(), tr.labels[:40].numpy(), CLASSES)
    _write_folder(odd / "test", te.images[:40].numpy(), te.labels[:40].numpy(), CLASSES)
    (odd / "train" / "cat").mkdir()
    Image.fromarray(tr.images[0, 0].numpy()).save(odd / "train" / "cat" / "x.png")
    return root


def experiment(**extra: Any) -> str:
    cfg = load_config(
        None,
        [
            *TINY_GREY,
            f"data.classes={json.dumps(CLASSES)}",
            "transform.mean=[0.3]",
            "transform.std=[0.3]",
            "methods=[fedavg]",
            "train.epochs=20",
            "train.batch_size=16",
            "train.optimizer=sgdm",
            "train.lr=0.05",
            "cache_dir=null",
            *(f"{k}={v}" for k, v in extra.items()),
        ],
    )
    return to_yaml(cfg)


def serve(sites: Path, tmp_path: Path, data: list[str], **spec_kw: Any) -> dict[str, Any]:
    spec = JobSpec(experiment=experiment(), sites=True, out_dir=str(tmp_path / "run"), **spec_kw)
    nodes = [{"data": f"imagefolder:{sites / d}"} for d in data]
    grid = LoopbackGrid(
        make_client_app(site_assembly.job_for_spec),
        len(data),
        run_config=spec.to_run_config(),
        node_configs=nodes,
    )
    with loopback_identity():
        _, record, _ = serve_experiment(grid, spec)
    return record


def test_sites_train_on_their_own_data_and_evaluate_the_final_model(sites, tmp_path) -> None:
    record = serve(sites, tmp_path, ["site0", "site1", "site2"])
    assert record["partition"]["scheme"] == "sites" and record["evaluated_at"] == "sites"
    per_site = record["site_accuracies"]
    assert set(per_site) == {"0", "1", "2"}
    # every site's test images counted once: the federation's accuracy is their pooled count
    test_sizes = [len(list((sites / f"site{s}" / "test").rglob("*.png"))) for s in range(3)]
    assert record["num_samples"] == sum(test_sizes)
    pooled = sum(per_site[str(s)] * n for s, n in enumerate(test_sizes)) / sum(test_sizes)
    assert record["global_test_accuracy"] == pytest.approx(pooled)
    assert record["global_test_accuracy"] > 0.1 + 0.15  # well above chance
    # site 2 holds classes 3..6 only: the classes no site tests on have no accuracy
    assert record["per_class_accuracy"][0] is not None
    assert record["bytes_down_evaluation"] > 0


def test_a_server_test_set_is_used_when_given(sites, tmp_path) -> None:
    record = serve(
        sites, tmp_path, ["site0", "site1", "site2"], server_test=f"imagefolder:{sites / 'server'}"
    )
    assert "site_accuracies" not in record
    assert record["num_samples"] == len(list((sites / "server" / "test").rglob("*.png")))
    assert record["global_test_accuracy"] > 0.25


def test_a_site_with_a_foreign_class_is_refused_before_training(sites, tmp_path) -> None:
    with pytest.raises(ConfigError, match="'cat'") as info:
        serve(sites, tmp_path, ["site0", "odd", "site2"])
    assert "client(s) [1]" in str(info.value)
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_site_scores_are_checked_and_merged_exactly() -> None:
    a = SiteScore.from_meta({"correct": [1, 2], "total": [2, 2]}, 2, client=0)
    b = SiteScore.from_meta({"correct": [0, 1], "total": [0, 4], "nonfinite": 1}, 2, client=1)
    m = merge_site_scores({0: a, 1: b}, 2)
    assert m["global_test_accuracy"] == 4 / 8 and m["per_class_accuracy"] == [0.5, 0.5]
    assert m["site_accuracies"] == {"0": 0.75, "1": 0.25} and m["nonfinite_outputs"] == 1
    for bad in (
        {"correct": [3, 0], "total": [2, 2]},  # more correct than images
        {"correct": [1], "total": [2]},  # wrong length
        {"correct": [1, "x"], "total": [2, 2]},
        {"correct": [0, 0], "total": [-1, 2]},
    ):
        with pytest.raises(DataError, match="site 4"):
            SiteScore.from_meta(bad, 2, client=4)


# --------------------------------------------------------------------------- identity
def _registry(path: Path, sizes: dict[int, int], nodes: dict[int, int]) -> str:
    entries = [{"partition-id": c, "node-id": nodes[c], "num-samples": n} for c, n in sizes.items()]
    path.write_text(json.dumps({"sites": entries}))
    return str(path)


def _train_size(sites: Path, name: str) -> int:
    return len(list((sites / name / "train").rglob("*.png")))


def test_a_node_claiming_another_sites_partition_id_is_refused(sites, tmp_path) -> None:
    """Four nodes, the second an impostor that claims partition-id 1 and
    answers before the real site 1. With a site registry (partition id ->
    registered node id) it is refused and named in the record, and the run
    equals the three honest sites' run; without one the run stops naming
    both nodes (the first answer never wins)."""
    data = ["site0", "server", "site1", "site2"]  # node 1: another's data, claims site 1
    nodes = [{"data": f"imagefolder:{sites / d}"} for d in data]
    nodes[1]["partition-id"], nodes[2]["partition-id"], nodes[3]["partition-id"] = 1, 1, 2
    real = {0: FIRST_NODE_ID, 1: FIRST_NODE_ID + 2, 2: FIRST_NODE_ID + 3}
    sizes = {c: _train_size(sites, f"site{c}") for c in range(3)}

    def run(registry: str, out: str) -> dict[str, Any]:
        spec = JobSpec(
            experiment=experiment(),
            sites=True,
            out_dir=str(tmp_path / out),
            site_registry=registry,
        )
        grid = LoopbackGrid(
            make_client_app(site_assembly.job_for_spec),
            4,
            run_config=spec.to_run_config(),
            node_configs=nodes,
        )
        with loopback_identity():
            return serve_experiment(grid, spec)[1]

    guarded = run(_registry(tmp_path / "reg.json", sizes, real), "guarded")
    assert (
        f"discovery: node {FIRST_NODE_ID + 1} claims partition-id 1, which the site registry "
        f"gives node {FIRST_NODE_ID + 2}: refused as an impostor"
    ) in guarded["warnings"]
    honest = serve(sites, tmp_path / "honest", ["site0", "site1", "site2"])
    assert guarded["global_test_accuracy"] == honest["global_test_accuracy"]
    assert guarded["bytes_up"] == honest["bytes_up"]
    with pytest.raises(
        ConfigError, match=f"nodes {FIRST_NODE_ID + 1} and {FIRST_NODE_ID + 2} both"
    ):
        run("", "unguarded")


def test_a_site_is_held_to_the_size_it_declared(sites, tmp_path) -> None:
    """The server bounds a site's ``num_samples`` by its declared size, not by
    the global ``server.max_num_samples``: a site that claims more is refused."""
    sizes = {c: _train_size(sites, f"site{c}") for c in range(3)}
    sizes[0] -= 1  # site 0 uploads its real count, one more than it declared
    nodes = {c: FIRST_NODE_ID + c for c in range(3)}
    record = serve(
        sites,
        tmp_path,
        ["site0", "site1", "site2"],
        site_registry=_registry(tmp_path / "reg.json", sizes, nodes),
    )
    ((_, client, why),) = record["refused"]
    assert client == 0 and "meta.num_samples" in why and f"{sizes[0]}" in why


def test_a_site_registry_is_checked(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"sites": [{"partition-id": 0, "node-id": 5, "num-samples": 0}]}))
    with pytest.raises(DataError, match="declares no samples"):
        SiteRegistry.from_file(bad)
    bad.write_text(json.dumps({"sites": [{"partition-id": 0, "node-id": "x", "num-samples": 9}]}))
    with pytest.raises(DataError, match="'node-id' must be an integer"):
        SiteRegistry.from_file(bad)
    bad.write_text("[" * 5000 + "]" * 5000)
    with pytest.raises(DataError, match="unreadable"):
        SiteRegistry.from_file(bad)
    two = SiteRegistry([Site(0, 5, 10), Site(1, 6, 10)])
    with pytest.raises(ConfigError, match="register each site once"):
        NoClientData(3, two)
    with pytest.raises(DataError, match="listed twice"):
        SiteRegistry([Site(0, 5, 10), Site(1, 5, 10)])
    data = NoClientData(2, two)
    assert (data.size(1), data.node_id(1), data.node_id(7)) == (10, 6, None)
    # a declared size cannot lift server.max_num_samples (10^18 was accepted before)
    huge = SiteRegistry([Site(0, 5, 10**18), Site(1, 6, 10)])
    with pytest.raises(ConfigError, match=r"10{18} samples for site 0, more than server"):
        NoClientData(2, huge, max_num_samples=10_000_000)
    assert huge.node_ids() == {0: 5, 1: 6}


def test_a_sites_server_bounds_the_registry_by_max_num_samples(sites, tmp_path) -> None:
    """The ServerApp of a sites run refuses, before any site trains, a
    registry whose declared size exceeds ``server.max_num_samples``."""
    sizes = {0: 10**18, 1: 5, 2: 5}
    nodes = {c: FIRST_NODE_ID + c for c in range(3)}
    with pytest.raises(ConfigError, match=r"more than server\.max_num_samples=10000000"):
        serve(
            sites,
            tmp_path,
            ["site0", "site1", "site2"],
            site_registry=_registry(tmp_path / "reg.json", sizes, nodes),
        )
    assert not (tmp_path / "run").exists()
