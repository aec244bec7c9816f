"""Real sites' jobs (``osfl.site_assembly``): the server of a real-sites run
holds no client data, and its config is checked before any site trains: the
normalisation the sites must share is set, and a method whose final state
would reveal the clients needs a server test set. The sites' runs themselves
are ``tests/fl/runtime/test_sites.py``'s."""

from __future__ import annotations

import json

import pytest

from osfl import site_assembly
from osfl.config import load_config
from osfl.errors import ConfigError
from osfl.fl.runtime.sites import NoClientData

CLASSES = [str(i) for i in range(10)]


def test_the_server_holds_no_client_data_and_checks_the_config() -> None:
    cfg = load_config(None, [f"data.classes={json.dumps(CLASSES)}", "data.channels=1"])
    with pytest.raises(ConfigError, match=r"transform\.mean, transform\.std"):
        site_assembly.site_server_job(cfg, "fedavg", 0)
    cfg = load_config(
        None,
        [
            "data.image_size=8",
            "data.channels=1",
            f"data.classes={json.dumps(CLASSES)}",
            "transform.mean=[0.3]",
            "transform.std=[0.3]",
        ],
    )
    job = site_assembly.site_server_job(cfg, "fedavg", 0)
    assert isinstance(job.clients, NoClientData) and job.evaluate_at_clients
    assert job.clients.size(0) is None
    with pytest.raises(ConfigError, match="holds no data"):
        job.clients.data(0)
    # a method whose final state would reveal clients needs a server test set
    with pytest.raises(ConfigError, match="server-test"):
        site_assembly.site_server_job(cfg, "fafi", 0)
