"""What the server does besides the method's own aggregation: its robust
aggregation rule, its screening of members, and its limits on uploads.

Public before round 0 (every party can know the rule), so it is part of the
:class:`~osfl.fl.context.RunContext`, and every method reads it there: the
weight-averaging methods (FedAvg and the schemes) combine states with
``aggregator`` (:mod:`osfl.fl.aggregators`), the methods that keep every
client's model (Ensemble, the distillation servers) screen each upload with
``member_filter``, and the round loop caps every upload's size and sample
count. ``osfl run server.aggregator=median ...`` sets it.
"""

from __future__ import annotations

from dataclasses import dataclass

from osfl.errors import ConfigError
from osfl.fl.aggregators import AGGREGATORS

#: How methods that keep individual client models screen an upload.
MEMBER_FILTERS = ("none", "finite", "finite_norm")


@dataclass(frozen=True)
class ServerConfig:
    """``aggregator``: how weight-averaging methods combine client states
    (``mean``, ``median``, ``trimmed_mean``, ``krum``, ``multi_krum``,
    ``norm_clip``, ``centered_clip``, ``dnc``; :data:`osfl.fl.aggregators.AGGREGATORS`),
    with ``trim_fraction`` (trimmed mean: the share cut at each end),
    ``byzantine`` (Krum's and Divide-and-Conquer's f), ``krum_select`` (Multi-Krum's m; null: n − f),
    ``clip_norm`` (norm and centered clipping's τ; null: the median update norm
    of the round) and ``cc_iterations`` (centered clipping's most iterations;
    it stops earlier at its fixed point). ``member_filter``: ``none``, ``finite`` (a
    member whose outputs on a probe batch are not finite is refused) or
    ``finite_norm`` (also a member whose update norm exceeds
    ``max_update_norm``). ``max_update_norm`` also bounds the update of
    every weight-averaging method (FedAvg, the schemes): a farther upload is
    refused. ``max_upload_bytes``: a cap on every upload's raw
    size (null: each spec's own, its tensors' bytes + 64 KiB).
    ``max_num_samples``: the largest ``meta.num_samples`` accepted where the
    server does not know a client's data size (real sites). ``min_clients``:
    the fewest usable uploads a round may aggregate; a round with fewer (the
    others dropped out, timed out or were refused) stops the run."""

    aggregator: str = "mean"
    trim_fraction: float = 0.1
    byzantine: int = 1
    krum_select: int | None = None
    clip_norm: float | None = None
    cc_iterations: int = 100
    member_filter: str = "none"
    max_update_norm: float | None = None
    max_upload_bytes: int | None = None
    max_num_samples: int = 10_000_000
    min_clients: int = 1

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(f"server: {msg}")

        AGGREGATORS.get(self.aggregator)  # unknown name -> ConfigError listing the valid ones
        need(
            0 <= self.trim_fraction < 0.5,
            f"trim_fraction must lie in [0, 0.5), got {self.trim_fraction}",
        )
        need(self.byzantine >= 0, f"byzantine must be >= 0, got {self.byzantine}")
        need(
            self.krum_select is None or self.krum_select >= 1,
            f"krum_select must be >= 1 or null, got {self.krum_select}",
        )
        need(
            self.clip_norm is None or self.clip_norm > 0,
            f"clip_norm must be > 0 or null, got {self.clip_norm}",
        )
        need(self.cc_iterations >= 1, f"cc_iterations must be >= 1, got {self.cc_iterations}")
        need(
            self.member_filter in MEMBER_FILTERS,
            f"member_filter must be one of {', '.join(MEMBER_FILTERS)}, got {self.member_filter!r}",
        )
        need(
            self.member_filter != "finite_norm" or self.max_update_norm is not None,
            "member_filter=finite_norm needs max_update_norm (the largest L2 norm of a "
            "member's update accepted)",
        )
        need(self.min_clients >= 1, f"min_clients must be >= 1, got {self.min_clients}")
        need(
            self.max_upload_bytes is None or self.max_upload_bytes >= 1,
            f"max_upload_bytes must be >= 1 or null, got {self.max_upload_bytes}",
        )
        need(self.max_num_samples >= 1, f"max_num_samples must be >= 1, got {self.max_num_samples}")
