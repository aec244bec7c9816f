"""FAFI's server screen and client step, called directly: the member filter
on prototypes and extractors, the broadcast a client loads, the class counts
the median fusion reads, and the hyper-parameters the server announces (the
mutants of ``osfl.methods.fafi.method`` the simulation tests did not see;
TESTING.md, "Mutation testing").
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict
from typing import Any

import pytest
import torch

from osfl.assembly import SeedContext, build_federation, build_run, load_splits
from osfl.config import load_config
from osfl.errors import UploadError
from osfl.fl.context import ClientContext
from osfl.fl.upload import Broadcast, Upload, validate
from osfl.methods.fafi import FAFI, FAFIConfig
from support.simulated_device import simulated_device
from support.tiny import TINY

OVERFLOW = "prototype norms overflow float32: the fused scores would not be finite"


@pytest.fixture(scope="module")
def ctx() -> SeedContext:
    cfg = load_config(None, [*TINY, "cache_dir=null", "train.epochs=1"])
    splits = load_splits(cfg)
    fed = build_federation(cfg, splits.train, 0)
    return SeedContext(splits, fed, build_run(cfg, splits, fed, 0))


def _fafi(ctx: SeedContext, config: FAFIConfig | None = None, **server: Any) -> FAFI:
    run = dataclasses.replace(ctx.run, server=dataclasses.replace(ctx.run.server, **server))
    return FAFI(config or FAFIConfig(), run)


def _upload(m: FAFI, state: dict[str, Any], prototypes: torch.Tensor, scale: float = 0.0) -> Upload:
    """Client 1's upload: the broadcast extractor, its first float tensor
    moved by ``scale``, and ``prototypes``."""
    extractor = m._initial_extractor(state, m.arch_of(1)).state_dict()
    first = next(k for k, v in extractor.items() if v.is_floating_point())
    moved = {k: v + scale if k == first else v for k, v in extractor.items()}
    tensors = {"extractor." + k: v for k, v in moved.items()}
    return Upload(tensors={**tensors, "prototypes": prototypes}, meta={"num_samples": 10})


def test_without_a_member_filter_nothing_is_screened(ctx) -> None:
    m = _fafi(ctx, member_filter="none")
    state = m.init_state()
    assert m.screen(state, 0, 1, _upload(m, state, torch.full((10, 32), 1e30))) is None


def test_prototypes_are_refused_when_a_rows_norm_overflows(ctx) -> None:
    """Per row, as the fusion computes the norms: ten rows of norm 1.5e19
    each are finite (their squares sum past float32's range only over all
    rows together), one row of 1e30 overflows."""
    m = _fafi(ctx, member_filter="finite")
    state = m.init_state()
    rows = torch.zeros(10, 32)
    rows[:, 0] = 1.5e19
    assert m.screen(state, 0, 1, _upload(m, state, rows)) is None
    rows[3, 1] = 1e30
    assert m.screen(state, 0, 1, _upload(m, state, rows)) == OVERFLOW


def test_an_extractor_is_bounded_by_its_update_from_the_broadcast(ctx) -> None:
    m = _fafi(ctx, member_filter="finite_norm", max_update_norm=1.0)
    state = m.init_state()
    protos = torch.randn(10, 32)
    assert m.screen(state, 0, 1, _upload(m, state, protos)) is None
    why = m.screen(state, 0, 1, _upload(m, state, protos, scale=10.0))
    assert why is not None and why.startswith("update norm") and "max_update_norm 1.0" in why


def test_an_extractor_whose_features_are_not_finite_is_refused(ctx) -> None:
    """Loaded into client 1's own architecture (``models`` listed)."""
    m = _fafi(ctx, FAFIConfig(models=[ctx.run.model.name]), member_filter="finite")
    state = m.init_state()
    why = m.screen(state, 0, 1, _upload(m, state, torch.randn(10, 32), scale=1e38))
    assert why == "member outputs are not finite on the server's probe batch"


def _client_data(ctx: SeedContext, classes: int) -> Any:
    labels = ctx.splits.train.labels
    keep = torch.nonzero(labels < classes).flatten()[:12]
    return ctx.splits.train.subset(keep.numpy())


def test_a_client_loads_its_whole_broadcast_init_or_refuses(ctx) -> None:
    m = _fafi(ctx)
    broadcast = m.broadcast(m.init_state(), 0)
    first = next(iter(broadcast.tensors))
    short = Broadcast(tensors={k: v for k, v in broadcast.tensors.items() if k != first})
    with pytest.raises(RuntimeError, match="Missing key"):
        m.client_update(
            ClientContext(ctx.run, 0, 0, torch.Generator()), short, _client_data(ctx, 3)
        )


def test_class_counts_cover_every_class_of_the_run(ctx) -> None:
    """The median fusion's holders: a client without the last classes still
    sends one count per class of the run (zeros for those)."""
    m = _fafi(ctx, FAFIConfig(fusion="median"))
    data = _client_data(ctx, 3)
    up = m.client_update(
        ClientContext(ctx.run, 0, 0, torch.Generator()), m.broadcast(m.init_state(), 0), data
    )
    counts = torch.bincount(data.labels, minlength=10).tolist()
    assert up.meta["class_counts"] == counts and len(counts) == 10 and counts[-1] == 0
    assert up.meta["num_samples"] == 12


@pytest.mark.parametrize(
    "config",
    [
        FAFIConfig(proto_update="held"),  # its gradient mask is made where the net is
        FAFIConfig(prototypes="class_mean"),  # feature means computed on the device
    ],
)
def test_a_client_trains_and_computes_its_prototypes_on_the_runs_device(
    ctx, config: FAFIConfig
) -> None:
    with simulated_device() as dev:
        run = dataclasses.replace(ctx.run, device=dev)
        m = FAFI(config, run)
        up = m.client_update(
            ClientContext(run, 0, 0, torch.Generator()),
            m.broadcast(m.init_state(), 0),
            _client_data(ctx, 3),
        )
    assert up.tensors["prototypes"].shape == (10, 32)


def test_the_announced_hyperparameters_name_the_scheme_and_its_options(ctx) -> None:
    config = FAFIConfig(fusion="average")
    hp = _fafi(ctx, config).public_hparams()
    assert hp["fl"] == {"scheme": "fafi", **asdict(config)}
    assert hp["fl"]["fusion"] == "average"


def test_prototypes_of_another_dtype_are_refused(ctx) -> None:
    m = _fafi(ctx)
    state = m.init_state()
    spec = m.upload_spec(state, 0, 1)
    good = _upload(m, state, torch.randn(10, 32))
    validate(good, spec, client=1)
    with pytest.raises(UploadError, match="prototypes"):
        validate(_upload(m, state, torch.randn(10, 32, dtype=torch.float64)), spec, client=1)


# --------------------------------------------------------------------------- the predictor
def _with_clients(m: FAFI, ids: list[int], drop: str | None = None) -> dict[str, Any]:
    """The server state after ``ids`` uploaded the broadcast extractor (the
    first one without the key ``drop``: a damaged state)."""
    state = m.init_state()
    ext = m._initial_extractor(state, m.arch_of(ids[0])).state_dict()
    clients = {
        c: {
            "extractor": {k: v.clone() for k, v in ext.items() if not (k == drop and c == ids[0])},
            "prototypes": torch.randn(10, 32),
            "num_samples": 5 + c,
        }
        for c in ids
    }
    return {**state, "clients": clients}


def test_the_params_fusion_averages_one_architecture_even_for_one_client(ctx) -> None:
    config = FAFIConfig(fusion="params", models=[ctx.run.model.name], scoring="unit_feature")
    predictor = _fafi(ctx, config).predictor(_with_clients(_fafi(ctx, config), [4]))
    assert (predictor.fusion, predictor.scoring, len(predictor.extractors)) == (
        "average",
        "unit_feature",
        1,
    )


@pytest.mark.parametrize("fusion", ["iffi", "params"])
def test_a_stored_extractor_missing_a_key_is_not_loaded_in_part(ctx, fusion: str) -> None:
    """A damaged server state (a resumed file) fails to load rather than
    leaving a layer at its fresh initial weights."""
    m = _fafi(ctx, FAFIConfig(fusion=fusion))
    first = next(iter(m._initial_extractor(m.init_state(), m.arch_of(0)).state_dict()))
    with pytest.raises(RuntimeError, match="Missing key"):
        m.predictor(_with_clients(m, [0, 1], drop=first))


def test_the_iffi_predictor_takes_the_configs_feature_options(ctx) -> None:
    config = FAFIConfig(normalize_features=True, scoring="unit_feature")
    predictor = _fafi(ctx, config).predictor(_with_clients(_fafi(ctx, config), [0, 2]))
    assert (predictor.fusion, predictor.normalize_features, predictor.scoring) == (
        "iffi",
        True,
        "unit_feature",
    )
    assert predictor.noise_spec.seed is not None and len(predictor.extractors) == 2
