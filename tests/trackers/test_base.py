"""The tracker contract's helpers: which numbers a round and a record hand the
backends, under which names (osfl.trackers.base)."""

from __future__ import annotations

from osfl.record import RunRecord
from osfl.trackers import TRACKERS
from osfl.trackers.base import (
    chunks,
    flatten,
    last_round,
    record_scalars,
    round_scalars,
    safe_key,
    tag_prefix,
)


def test_every_backend_is_registered_with_its_extra() -> None:
    assert TRACKERS.names() == ["mlflow", "tensorboard", "wandb"]
    assert {n: TRACKERS.get(n).extra for n in TRACKERS} == {
        "mlflow": "mlflow",
        "tensorboard": "tensorboard",
        "wandb": "wandb",
    }


def test_a_tag_names_the_grid_point_method_and_seed() -> None:
    assert tag_prefix("fedavg", 0) == "fedavg/seed0"
    assert tag_prefix("fedavg", 3, "train.lr=0.1 seeds=3") == "train.lr=0.1,seeds=3/fedavg/seed3"


def test_a_round_gives_its_accuracy_metrics_and_counters() -> None:
    """Each accuracy under the round event's (and the curve's) name, and
    ``accuracy``, the one the tables rank (the server predictor's); the test
    set's size, lists and non-finite numbers are no curve."""
    round_record = {
        "round": 4,
        "clients": [0, 1],
        "bytes_up": 100,
        "bytes_down": 50,
        "bytes_refused": 0,
        "time_client_s": 1.5,
        "time_server_s": 0.25,
        "metrics": {
            "global_test_accuracy": 0.625,
            "validation_accuracy": 0.5,
            "num_samples": 451,
            "per_class_accuracy": [0.5, 0.75],
            "loss": float("nan"),
            "converged": True,
        },
    }
    assert round_scalars(round_record) == {
        "accuracy": 0.625,
        "global_test_accuracy": 0.625,
        "validation_accuracy": 0.5,
        "bytes_up": 100.0,
        "bytes_down": 50.0,
        "bytes_refused": 0.0,
        "time_client_s": 1.5,
        "time_server_s": 0.25,
    }
    assert round_scalars({"round": 0}) == {}


def test_a_rounds_clients_mean_is_its_own_scalar() -> None:
    """EFTViT (clients' own models beside a server predictor): the server's
    accuracy is ``global_test_accuracy`` and ``accuracy``, the clients' mean
    only ``mean_client_accuracy``; ``local`` (no server predictor, a null
    ``global_test_accuracy``) ranks the clients' mean."""
    own = {"round": 1, "metrics": {"global_test_accuracy": 0.25, "mean_client_accuracy": 0.5}}
    assert round_scalars(own) == {
        "accuracy": 0.25,
        "global_test_accuracy": 0.25,
        "mean_client_accuracy": 0.5,
    }
    local = {"round": 0, "metrics": {"global_test_accuracy": None, "mean_client_accuracy": 0.5}}
    assert round_scalars(local) == {"accuracy": 0.5, "mean_client_accuracy": 0.5}


def test_a_record_gives_what_the_tables_rank() -> None:
    """``accuracy`` is the ranked one: the server's, else the clients' own mean."""
    fedavg = RunRecord.from_dict(
        {
            "method": "fedavg",
            "seed": 0,
            "rounds": 3,
            "global_test_accuracy": 0.75,
            "bytes_up": 1000,
            "bytes_down": 2000,
            "time_s": {"total": 2.5, "client": 2.0},
        }
    )
    assert record_scalars(fedavg) == {
        "accuracy": 0.75,
        "global_test_accuracy": 0.75,
        "bytes_up": 1000.0,
        "bytes_down": 2000.0,
        "time_s": 2.5,
    }
    assert last_round(fedavg) == 2
    local = RunRecord.from_dict(
        {"method": "local", "seed": 1, "global_test_accuracy": None, "mean_client_accuracy": 0.25}
    )
    assert record_scalars(local) == {"accuracy": 0.25, "mean_client_accuracy": 0.25}
    assert last_round(local) == 0


def test_a_config_flattens_to_dotted_parameters() -> None:
    config = {"train": {"lr": 0.1, "epochs": 2}, "seeds": [0, 1], "method": {}, "name": "x"}
    assert flatten(config) == {
        "train.lr": 0.1,
        "train.epochs": 2,
        "seeds": [0, 1],
        "method": {},
        "name": "x",
    }


def test_keys_keep_only_the_characters_mlflow_accepts() -> None:
    assert safe_key("train.lr=0.1,seeds=0/fedavg/seed0/accuracy") == (
        "train.lr_0.1_seeds_0/fedavg/seed0/accuracy"
    )
    assert safe_key("a-b_c d/e.f") == "a-b_c d/e.f"


def test_batches_keep_order_and_size() -> None:
    assert chunks(list(range(5)), 2) == [[0, 1], [2, 3], [4]]
    assert chunks([], 100) == []
