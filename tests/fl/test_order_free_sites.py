"""On real sites the server's DnC draw depends on a secret no client can know
(issue 55): a real-sites server (Flower, loopback, three sites with their own
image folders) draws a random ``server_secret`` of its own; no message to a
site — broadcast, evaluation payload or any other — and no file of the run
directory carries it, and no site's job holds one. Two servers draw two
secrets."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from PIL import Image

from osfl import site_assembly
from osfl.config import load_config, to_yaml
from osfl.data.sources import load_data
from osfl.fl.observers import Observer
from osfl.flower.client import make_client_app
from osfl.flower.loopback import LoopbackGrid, loopback_identity
from osfl.flower.spec import JobSpec
from osfl.flower_app.apps import serve_experiment
from support.tiny import TINY_GREY

CLASSES = [str(i) for i in range(10)]


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> Path:
    """Three site folders (train/ and test/) cut from the 8-px digits: each
    class's images dealt to the sites in turn, so every site holds every class."""
    root = tmp_path_factory.mktemp("sites")
    splits = load_data("digits", image_size=8, max_per_class=6)
    for part, data in (("train", splits.train), ("test", splits.test)):
        labels = data.labels.numpy()
        for k in range(len(CLASSES)):
            for j, i in enumerate(np.flatnonzero(labels == k)):
                d = root / f"site{j % 3}" / part / CLASSES[k]
                d.mkdir(parents=True, exist_ok=True)
                Image.fromarray(data.images[i, 0].numpy()).save(d / f"{i}.png")
    return root


def _cfg(**extra: Any) -> Any:
    return load_config(
        None,
        [
            *TINY_GREY,
            f"data.classes={json.dumps(CLASSES)}",
            "transform.mean=[0.3]",
            "transform.std=[0.3]",
            "methods=[fedavg]",
            "method.fedavg.rounds=2",
            "server.aggregator=dnc",
            "train.epochs=1",
            "train.batch_size=16",
            "cache_dir=null",
            *(f"{k}={v}" for k, v in extra.items()),
        ],
    )


class _RecordingGrid(LoopbackGrid):
    """A loopback grid that keeps the wire bytes of every message it sends to a site."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.sent: list[bytes] = []

    def _deliver(self, message: Any) -> Any:
        objects = get_all_nested_objects(message)
        self.sent.append(b"".join(obj.deflate() for obj in objects.values()))
        return super()._deliver(message)


class _ServerRun(Observer):
    """The server's RunContext, as the round loop hands it to its observers."""

    def __init__(self) -> None:
        self.run: Any = None

    def on_run_start(self, method_name: str, run: Any) -> None:
        self.run = run


def test_the_servers_secret_is_in_no_message_to_a_site_and_in_no_file(sites, tmp_path) -> None:
    spec = JobSpec(experiment=to_yaml(_cfg()), sites=True, out_dir=str(tmp_path / "run"))
    site_jobs = []

    def site_job(s: JobSpec) -> Any:
        job = site_assembly.job_for_spec(s)
        site_jobs.append(job)
        return job

    grid = _RecordingGrid(
        make_client_app(site_job),
        3,
        run_config=spec.to_run_config(),
        node_configs=[{"data": f"imagefolder:{sites / f'site{s}'}"} for s in range(3)],
    )
    server = _ServerRun()
    with loopback_identity():
        _, record, out = serve_experiment(grid, spec, observers=[server])
    assert record["rounds"] == 2  # two rounds of DnC, the model sent to the sites twice

    secret = server.run.server_secret
    assert re.fullmatch(r"[0-9a-f]{64}", secret)
    forms = [secret.encode(), bytes.fromhex(secret), secret.upper().encode()]
    assert len(grid.sent) >= 3 * 2 + 3  # two training rounds and the sites' evaluation
    for message in grid.sent:
        assert not any(f in message for f in forms)
    files = [p for p in Path(out).rglob("*") if p.is_file()]
    assert files
    for path in files:
        assert not any(f in path.read_bytes() for f in forms), path
    assert site_jobs and all(job.run.server_secret is None for job in site_jobs)


def test_every_real_sites_server_draws_its_own_secret() -> None:
    a = site_assembly.site_server_job(_cfg(), "fedavg", 0)
    b = site_assembly.site_server_job(_cfg(), "fedavg", 0)
    assert a.run.server_secret and b.run.server_secret
    assert a.run.server_secret != b.run.server_secret
    assert a.method.run.server_secret == a.run.server_secret  # the method combines with it
    assert a.run.server_secret not in repr(a.run)
