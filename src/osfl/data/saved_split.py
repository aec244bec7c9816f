"""A saved split reused: ``partition.from_file=PARTITION.json`` (issue "What a
researcher expects, round three", item 3).

``osfl partition ... --out p.json`` writes a federation; a run that names it
trains on exactly those clients instead of drawing a split, so two runs (two
machines, two versions of osfl, a baseline from another library that reads
the same file) compare on the same clients. The file is validated field by
field (:meth:`Federation.load_json`: a peer's or a user's file is never
trusted), and it must have been made on this run's train set (its labels'
content hash) with the run's number of clients; otherwise one clear error.
Every seed of a sweep then shares this one split.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from osfl.data.federation import Federation, fingerprint_labels
from osfl.errors import ConfigError, DataError


def load_saved_split(
    path: str | Path, labels: np.ndarray, domains: np.ndarray | None, num_clients: int
) -> Federation:
    """The federation saved in ``path``, checked against this run's train
    ``labels`` (and ``domains``, where its scheme read them) and ``num_clients``."""
    fed = Federation.load_json(path)
    made_on = {fingerprint_labels(labels)}
    if domains is not None:
        made_on.add(fingerprint_labels(labels, domains))
    if fed.data_fingerprint not in made_on or fed.num_samples != len(labels):
        raise DataError(
            f"partition.from_file={path}: made on another train set ({fed.num_samples} samples, "
            f"labels {fed.data_fingerprint[:12]}; this run's: {len(labels)} samples, "
            f"labels {fingerprint_labels(labels)[:12]}): same data, data.max_per_class and "
            "data.classes as when it was written"
        )
    if fed.num_clients != num_clients:
        raise ConfigError(
            f"partition.from_file={path} holds {fed.num_clients} clients; set "
            f"partition.num_clients={fed.num_clients}"
        )
    return fed
