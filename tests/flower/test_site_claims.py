"""Which node plays which site (issue 43, "Hostile peers and damaged files,
round three"): the site registry binds the nodes in a rehearsal too, its
declared sizes stay under ``server.max_num_samples``, a refused impostor and
a registry that disagrees with the nodes are named as such, and without a
registry two nodes claiming one partition id stop the run unless run config
``keep-node`` says which to keep — the first answer never decides.

The rehearsal runs are the ServerApp's own (:func:`serve_experiment`) over a
loopback Grid of the osfl ClientApp; the pure rules are tested on
:mod:`osfl.flower.claims` directly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from osfl.config import load_config, to_yaml
from osfl.errors import ConfigError
from osfl.flower.claims import KEEP_NODE, REGISTRY, Binding, Claim, ClaimsMismatch, bind, settle
from osfl.flower.client import make_client_app
from osfl.flower.loopback import FIRST_NODE_ID, LoopbackGrid, loopback_identity
from osfl.flower.spec import JobSpec, parse_keep_nodes
from osfl.flower_app.apps import serve_experiment
from osfl.site_assembly import job_for_spec
from support.tiny import TINY_SITE_CLAIMS

A, B, C, D = (FIRST_NODE_ID + i for i in range(4))


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Any:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class _Tracking:
    """The osfl ClientApp, noting which nodes were sent train messages."""

    def __init__(self) -> None:
        self.app = make_client_app(job_for_spec)
        self.trained: set[int] = set()

    def __call__(self, message: Any, context: Any) -> Any:
        if message.metadata.message_type.startswith("train"):
            self.trained.add(int(context.node_id))
        return self.app(message, context)


def _registry(path: Path, nodes: dict[int, int], size: int = 100) -> str:
    sites = [{"partition-id": c, "node-id": n, "num-samples": size} for c, n in nodes.items()]
    path.write_text(json.dumps({"sites": sites}))
    return str(path)


def _serve(
    tmp_path: Path, out: str, claims: list[int], **spec_kw: Any
) -> tuple[dict[str, Any], _Tracking]:
    """A rehearsal whose node ``i`` claims ``claims[i]``."""
    text = to_yaml(load_config(None, TINY_SITE_CLAIMS))
    spec = JobSpec(experiment=text, out_dir=str(tmp_path / out), **spec_kw)
    app = _Tracking()
    grid = LoopbackGrid(
        app,
        len(claims),
        run_config=spec.to_run_config(),
        node_configs=[{"partition-id": c} for c in claims],
    )
    with loopback_identity():
        _, record, _ = serve_experiment(grid, spec)
    return record, app


def _failed(tmp_path: Path, out: str) -> str:
    """The reason of the run directory's ``run_failed`` event."""
    events = [
        json.loads(line)
        for line in (tmp_path / out / "events.jsonl").read_text().split("\n")
        if line
    ]
    (failed,) = [e for e in events if e["event"] == "run_failed"]
    return str(failed["reason"])


@pytest.fixture(scope="module")
def honest(tmp_path_factory) -> dict[str, Any]:
    return _serve(tmp_path_factory.mktemp("honest"), "run", [0, 1, 2])[0]


# --------------------------------------------------------------------------- rehearsal runs
def test_a_rehearsal_reads_the_site_registry_and_refuses_an_impostor(tmp_path, honest) -> None:
    """Node B claims site 1, registered to node C, and answers first: refused,
    named in the record, never trained; the run is the honest one."""
    registry = _registry(tmp_path / "reg.json", {0: A, 1: C, 2: D})
    record, app = _serve(tmp_path, "run", [0, 1, 1, 2], site_registry=registry)
    assert B not in app.trained and app.trained == {A, C, D}
    line = (
        f"discovery: node {B} claims partition-id 1, which the site registry gives node {C}: "
        "refused as an impostor"
    )
    assert line in record["warnings"]
    assert record["global_test_accuracy"] == honest["global_test_accuracy"]
    assert record["bytes_up"] == honest["bytes_up"]


def test_two_nodes_claiming_one_partition_id_stop_the_run(tmp_path) -> None:
    """Without a registry the first answer does not win: one clear error
    naming both nodes and the partition id, before anyone trains."""
    with pytest.raises(ClaimsMismatch) as info:
        _serve(tmp_path, "run", [0, 1, 1, 2])
    line = str(info.value)
    assert f"nodes {B} and {C} both claim partition-id 1" in line and "keep-node" in line
    assert "\n" not in line and info.value.exit_status == 2
    assert f"nodes {B} and {C} both claim partition-id 1" in _failed(tmp_path, "run")


def test_keep_node_says_which_claimant_plays_the_site(tmp_path, honest) -> None:
    record, app = _serve(tmp_path, "run", [0, 1, 1, 2], keep_nodes=((1, C),))
    assert app.trained == {A, C, D}
    assert (
        f"discovery: node {B} claims partition-id 1, which run config keep-node gives node "
        f"{C}: refused as an impostor"
    ) in record["warnings"]
    assert record["global_test_accuracy"] == honest["global_test_accuracy"]


def test_a_registry_that_swaps_two_node_ids_is_named_as_a_mismatch(tmp_path) -> None:
    """A typo that swaps sites 0 and 1's node ids: not two impostors and
    "no SuperNode connected", but one line saying the registry and the nodes
    disagree, with the node ids and partition ids."""
    registry = _registry(tmp_path / "reg.json", {0: B, 1: A, 2: C})
    with pytest.raises(ClaimsMismatch) as info:
        _serve(tmp_path, "run", [0, 1, 2], site_registry=registry)
    line = str(info.value)
    assert line.startswith("the site registry and the connected nodes disagree: ")
    assert f"node {A} is partition-id 1 in the site registry but claims partition-id 0" in line
    assert f"node {B} is partition-id 0 in the site registry but claims partition-id 1" in line
    assert "no SuperNode" not in line and info.value.exit_status == 2
    assert "the site registry and the connected nodes disagree" in _failed(tmp_path, "run")


def test_a_site_whose_registered_node_is_absent_says_why_in_the_record(tmp_path) -> None:
    """The registry names node 9999 for site 1 (a typo); node B claims site 1:
    refused as an impostor, and site 1's failure in every round says its
    registered node did not answer, not "no SuperNode connected"."""
    registry = _registry(tmp_path / "reg.json", {0: A, 1: 9999, 2: C})
    record, app = _serve(tmp_path, "run", [0, 1, 2], site_registry=registry, node_timeout=0.3)
    assert app.trained == {A, C}
    whys = [why for _, client, why in record["refused"] if client == 1]
    assert len(whys) == 2 and all(
        f"its node 9999 (the site registry) did not answer; node(s) {B} claimed it" in w
        for w in whys
    )
    assert any(f"node {B} claims partition-id 1" in w for w in record["warnings"])


def test_a_registry_cannot_lift_max_num_samples(tmp_path) -> None:
    """A declared size of 10^18 is refused before any node is asked."""
    registry = _registry(tmp_path / "reg.json", {0: A, 1: B, 2: C}, size=10**18)
    with pytest.raises(ConfigError, match=r"more than server.max_num_samples=10000000") as info:
        _serve(tmp_path, "run", [0, 1, 2], site_registry=registry)
    assert "site 0" in str(info.value) and info.value.exit_status == 2
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- the rules
def test_claims_are_settled_by_bindings_never_by_answer_order() -> None:
    bound = bind(3, [(REGISTRY, {0: 10, 1: 11, 2: 12})])
    for order in ([Claim(9, 1), Claim(11, 1)], [Claim(11, 1), Claim(9, 1)]):
        verdict = settle([Claim(10, 0), *order, Claim(12, 2)], bound)
        assert verdict.nodes == {0: 10, 1: 11, 2: 12} and len(verdict.refused) == 1
    # without bindings: the same claims stop, whichever answered first
    for order in ([Claim(9, 1), Claim(11, 1)], [Claim(11, 1), Claim(9, 1)]):
        with pytest.raises(ClaimsMismatch, match="nodes 9 and 11 both claim partition-id 1"):
            settle([Claim(10, 0), *order], {})
    # a flood of claimants: the message names a few and counts the rest
    with pytest.raises(ClaimsMismatch, match=r"50 nodes \(100, 101, .* and 44 more\)") as info:
        settle([Claim(100 + i, 0) for i in range(50)], {})
    assert len(str(info.value)) < 600
    refused = settle([Claim(100 + i, 0) for i in range(50)], {0: Binding(7, REGISTRY)})
    assert len(refused.refused) == 7 and refused.refused[-1] == "and 44 more impostor(s) refused"
    assert refused.nodes == {} and "did not answer" in refused.absent[0]


def test_bindings_are_checked() -> None:
    with pytest.raises(ConfigError, match="names partition-id 5; the run has 3 sites"):
        bind(3, [(KEEP_NODE, {5: 1})])
    with pytest.raises(ConfigError, match="binds partition-id 1 to node 11, run config keep-node"):
        bind(3, [(REGISTRY, {1: 11}), (KEEP_NODE, {1: 12})])
    with pytest.raises(ConfigError, match="node 11 is bound to partition-ids 0 and 1"):
        bind(3, [(REGISTRY, {0: 11}), (KEEP_NODE, {1: 11})])
    assert bind(3, [(REGISTRY, {1: 11}), (KEEP_NODE, {1: 11, 2: 12})]) == {
        1: Binding(11, REGISTRY),
        2: Binding(12, KEEP_NODE),
    }


def test_keep_node_run_config_is_parsed_and_checked() -> None:
    assert parse_keep_nodes(" 2=77  1=5512046195451640853 ") == ((1, 5512046195451640853), (2, 77))
    spec = JobSpec.from_run_config({"keep-node": "1=9"})
    assert spec.keep_nodes == ((1, 9),)
    assert JobSpec.from_run_config(spec.to_run_config()) == spec
    for bad, why in (
        ("1:9", "is not"),
        ("1=-9", "is not"),
        ("1=²", "is not"),
        ("1=9 1=8", "partition-id 1 twice"),
        ("1=9 2=9", "node id 9 twice"),
    ):
        with pytest.raises(ConfigError, match=why):
            parse_keep_nodes(bad)
