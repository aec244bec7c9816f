"""The experiment's schema: the frozen dataclasses one ``osfl run`` is built from.

A run is described by one :class:`ExperimentConfig`, loaded in three layers
(:mod:`osfl.config.loading`; docs/design.md §5). The local-training recipe is
:class:`osfl.fl.train_config.TrainConfig` itself (its defaults live in one
place); per-method options are each method's own ``Config`` dataclass
(:mod:`osfl.config.method_options`).
Reference: OmegaConf structured configs,
https://omegaconf.readthedocs.io/en/2.3_branch/structured_config.html
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from osfl.errors import ConfigError
from osfl.fl.secagg_config import SecAggPlusConfig
from osfl.fl.server_config import ServerConfig
from osfl.fl.train_config import TrainConfig
from osfl.trackers import TRACKERS


@dataclass(frozen=True)
class DataConfig:
    """Where the images come from (``osfl.data.load_data(source, **options)``).

    ``classes``: the task's classes, in label order (null: all of the
    source's). In a rehearsal the source is restricted to them (names, or
    indices into the source's list): e.g. CIFAR-10's classes 5-9 for an
    encoder pretrained on classes 0-4. Real sites (``docs/flower.md``) must
    give it: each site's folders are mapped onto it by name, and a site with
    a class outside it is refused before training.

    ``validation_fraction``: a class-stratified share of the train set held out
    before the clients' split (the same samples for every run seed); every
    evaluation then also reports ``validation_accuracy`` on it. Choose a
    setting (a learning rate, a round) by validation accuracy, never by test
    accuracy (REPRODUCTION.md says which rows did)."""

    source: str = "digits"
    image_size: int | None = 16
    channels: int | None = None
    max_per_class: int | None = None
    cache_dir: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    classes: list[str] | None = None
    validation_fraction: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ConfigError(
                f"data.validation_fraction must lie in [0, 1), got {self.validation_fraction}"
            )


@dataclass(frozen=True)
class PartitionConfig:
    """How the train set is split across clients (``osfl.data.partition``).

    Scheme parameters left ``None`` are not passed, so each scheme uses its own
    default (defined once, on the scheme) and only sees the ones it takes;
    ``seed: null`` means "the run seed" (each seed of a sweep draws its own
    split, as the papers' mean ± std do).
    """

    scheme: str = "dirichlet"
    num_clients: int = 5
    alpha: float | None = None
    classes_per_client: int | None = None
    min_partition_size: int | None = None
    seed: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    #: a federation file written by `osfl partition --out` to reuse instead of drawing a split
    from_file: str | None = None

    def params(self) -> dict[str, Any]:
        """Scheme parameters for ``make_federation`` (the ones that are set)."""
        named = {
            "alpha": self.alpha,
            "classes_per_client": self.classes_per_client,
            "min_partition_size": self.min_partition_size,
        }
        return {k: v for k, v in named.items() if v is not None} | dict(self.options)

    def scheme_params(self, takes: Collection[str]) -> dict[str, Any]:
        """The :meth:`params` a scheme that takes ``takes`` receives: a named
        field it does not take is left out (``alpha`` means nothing to
        ``iid``), explicit ``options`` go as given (the scheme refuses a wrong one)."""
        return {k: v for k, v in self.params().items() if k in takes or k in self.options}


@dataclass(frozen=True)
class ModelConfig:
    """A registered model name and its keyword arguments (``osfl.models.create_model``)."""

    name: str = "cnn_small"
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TransformConfig:
    """Named batched pipelines (``osfl.data.transforms.build_transform``) for
    local training and for evaluation. ``mean``/``std``: the per-channel
    normalisation (null: the train set's statistics, which only a rehearsal
    has; real sites must state them, so that every site normalises alike)."""

    train: str = "none"
    eval: str = "none"
    mean: list[float] | None = None
    std: list[float] | None = None

    def __post_init__(self) -> None:
        if (self.mean is None) != (self.std is None):
            raise ConfigError("give both transform.mean and transform.std, or neither")
        if self.std is not None and (
            len(self.mean or ()) != len(self.std) or not all(s > 0 for s in self.std)
        ):
            raise ConfigError(
                "transform.mean and transform.std need one value per channel, std > 0"
            )

    def normalisation(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """The stated ``(mean, std)``; ``None``: normalise with the train set's statistics."""
        if self.mean is None or self.std is None:
            return None
        return tuple(self.mean), tuple(self.std)


@dataclass(frozen=True)
class FlowerEngineConfig:
    """``runtime=flower_engine``: where Flower's simulation engine runs (a Ray
    of its own, or a cluster the user already runs) and how long its server
    waits (docs/flower.md). None of it changes a number: a client that misses
    a wait is a dropout the record names."""

    #: a running Ray cluster to join (host:port of its head, ray://host:10001, or auto); null: Ray's own RAY_ADDRESS if set, else a local Ray started and stopped by the run
    ray_address: str | None = None
    #: seconds the server waits for every engine node to register and answer before round 0 (each ClientApp builds its job then): raise it for many clients on a loaded machine
    node_timeout: float = 120.0
    #: seconds the server waits for a round's replies before it goes on without the clients still training
    round_timeout: float = 600.0

    def __post_init__(self) -> None:
        for key in ("node_timeout", "round_timeout"):
            value = getattr(self, key)
            if not (isinstance(value, int | float) and value > 0 and value < float("inf")):
                raise ConfigError(f"flower_engine.{key} must be seconds > 0, got {value!r}")
        if self.ray_address is not None and not self.ray_address.strip():
            raise ConfigError(
                "flower_engine.ray_address is empty: give host:port, ray://host:port or auto, "
                "or null for a local Ray"
            )


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything one ``osfl run`` needs. See ``configs/default.yaml`` for a
    commented example and ``docs/run-directory.md`` for what a run writes."""

    name: str = "default"
    data: DataConfig = field(default_factory=DataConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    transform: TransformConfig = field(default_factory=TransformConfig)
    # Method names; empty = every registered method that marks itself ``default_run``.
    methods: list[str] = field(default_factory=list)
    # Per-method overrides of the method's Config: {name: {key: value}}.
    method: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Per-method overrides of the local-training recipe, on top of `train` and the
    # method's own defaults:
    # {name: {key: value}}, e.g. {eftvit: {lr: 1.0e-5}} where one method needs another
    # learning rate than its baselines (osfl.assembly.train_recipe).
    method_train: dict[str, dict[str, Any]] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=lambda: [0])
    # Grid axes, each "key=v1,v2" (as `osfl run --sweep`, which adds to / replaces them).
    sweep: list[str] = field(default_factory=list)
    device: str = "auto"
    runtime: str = "simulation"
    # clients trained at once in the simulation (a thread pool): "auto" = the CPUs
    # this process may use, divided by threads_per_client. Results do not depend
    # on it (each client's generator is seeded; uploads are aggregated in order).
    # (Any: OmegaConf 2.3 takes no int | str union; checked in __post_init__.)
    parallel_clients: Any = "auto"
    # simulation: train one-shot clients of one architecture as one batched step
    # (osfl.fl.batched_training; same result up to float tolerance). Off by default:
    # on CPU it measured 1.4-2.8x for small 16-px models, about 1x at 32 px and
    # nothing on the default run's uneven clients (BENCHMARKS.md "Batched clients").
    batch_clients: bool = False
    # torch threads per client: an int >= 1, or null (all of them when sequential,
    # an equal share when parallel). Results depend on it in the last bits (torch
    # splits CPU reductions per thread), so it is chosen here, never by a timing.
    threads_per_client: int | None = 1
    out_dir: str | None = None
    cache_dir: str | None = ".osfl_cache"
    # Train (and cache) only these clients' local models, then stop each method
    # without aggregating or evaluating (null: every client, the whole run). A run
    # too long for one command trains its clients over several into the same
    # cache_dir; the last, full run finds them all there (osfl.fl.runtime.train_only).
    train_clients: list[int] | None = None
    audit: list[Any] = field(default_factory=list)
    # Client-side defence on every upload: {clip: L2 bound, sigma: noise std, scope: ...}
    # (osfl.privacy.defenses.DefenseConfig); empty = none.
    defense: dict[str, Any] = field(default_factory=dict)
    # Byzantine clients (a robustness experiment): {clients: [ids], kind: sign_flip, scale: 10}
    # (osfl.robustness.byzantine.ByzantineConfig); empty = every client honest.
    byzantine: dict[str, Any] = field(default_factory=dict)
    # The server's public rules: robust aggregation, member screening, upload limits
    # (osfl.fl.server_config.ServerConfig).
    server: ServerConfig = field(default_factory=ServerConfig)
    # Flower SecAgg+: the server learns only the clients' weighted mean
    # (osfl.fl.secagg_config.SecAggPlusConfig; docs/secure-aggregation.md).
    secagg: SecAggPlusConfig = field(default_factory=SecAggPlusConfig)
    # runtime=flower_engine: a Ray cluster to join, and the server's waits
    # (FlowerEngineConfig; docs/flower.md).
    flower_engine: FlowerEngineConfig = field(default_factory=FlowerEngineConfig)
    eval_local: bool = False
    eval_every: int = 0
    # Cost to an accuracy (osfl.convergence; needs eval_every > 0): the first round
    # reaching target_accuracy (a fraction, null: none), and compute time plus the
    # bytes over one link of link_mbps megabit/s.
    target_accuracy: float | None = None
    link_mbps: float = 500.0
    # Save the server state every N rounds under <run dir>/checkpoints/ (0 = never).
    checkpoint_every: int = 0
    scale: str = "cpu"
    progress: bool = True
    #: Experiment trackers that also receive the per-round metrics and the final
    #: table (osfl.trackers; docs/trackers.md): tensorboard, wandb, mlflow, each an
    #: optional extra (pip install "osfl[tensorboard]"); empty = none.
    logger: list[str] = field(default_factory=list)

    def _check_parallel(self) -> None:
        """``parallel_clients`` (a count or auto) and ``threads_per_client`` (a count or null)."""
        p = self.parallel_clients
        if not (p == "auto" or (type(p) is int and p >= 1)):
            raise ConfigError(f"parallel_clients must be an integer >= 1 or auto, got {p!r}")
        t = self.threads_per_client
        if t == "auto":
            raise ConfigError(
                "threads_per_client=auto is gone: it chose the count by a timing, so results "
                "depended on the machine's load; give a number (1, the default, uses every "
                "core through parallel_clients=auto and gives the same numbers on any load)"
            )
        if not (t is None or (type(t) is int and t >= 1)):
            raise ConfigError(f"threads_per_client must be an integer >= 1 or null, got {t!r}")

    def __post_init__(self) -> None:
        if not self.seeds:
            raise ConfigError("seeds must list at least one seed, e.g. seeds=[0]")
        self._check_parallel()
        if self.partition.num_clients < 1:
            raise ConfigError(
                f"partition.num_clients must be >= 1, got {self.partition.num_clients}"
            )
        self._check_train_clients()
        self._check_logger()
        if self.checkpoint_every < 0:
            raise ConfigError(
                f"checkpoint_every must be >= 0 (0 = never), got {self.checkpoint_every}"
            )
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ConfigError(
                f"target_accuracy is a fraction in (0, 1] (e.g. 0.6), got {self.target_accuracy}"
            )
        if not self.link_mbps > 0:
            raise ConfigError(f"link_mbps must be > 0 (megabit/s), got {self.link_mbps}")
        if self.eval_every < 0:
            raise ConfigError(
                f"eval_every must be >= 0 (0 = only at the end), got {self.eval_every}"
            )
        if self.secagg.enabled and self.audit:
            raise ConfigError(
                "audit reads each client's upload, which secagg.enabled hides from the server: "
                "run the audit without secure aggregation"
            )
        choices = {
            "device": (self.device, ("auto", "cpu", "cuda", "mps")),
            "scale": (self.scale, ("cpu", "gpu")),
        }
        for key, (value, valid) in choices.items():
            if value.split(":")[0] not in valid:
                raise ConfigError(f"{key}={value!r} is not valid; choose one of {', '.join(valid)}")

    def _check_logger(self) -> None:
        """Registered tracker names, each once (whether its package is
        installed is checked when a run starts: a config stays loadable without it)."""
        for name in self.logger:
            TRACKERS.get(name)  # an unknown name: a ConfigError listing the valid ones
        names = [n.lower() for n in self.logger]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"logger names {', '.join(twice)} more than once")

    def _check_train_clients(self) -> None:
        """Client ids in the federation, a cache to train into, the simulation."""
        ids = self.train_clients
        if ids is None:
            return
        n = self.partition.num_clients
        if not ids or any(type(c) is not int or not 0 <= c < n for c in ids):
            raise ConfigError(
                f"train_clients must list client ids in 0..{n - 1} (partition.num_clients={n}), "
                f"got {ids!r}"
            )
        if self.cache_dir is None:
            raise ConfigError("train_clients trains into the client cache: set cache_dir")
        if self.runtime != "simulation":
            raise ConfigError(f"train_clients needs runtime=simulation, got {self.runtime!r}")
        if self.audit:
            raise ConfigError("train_clients sends no uploads to audit: run the audit without it")
