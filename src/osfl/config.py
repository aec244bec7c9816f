"""Experiment configuration: OmegaConf structured configs built from frozen dataclasses.

A run is described by one :class:`ExperimentConfig`. It is loaded in three
layers, each overriding the previous one (docs/design.md §5)::

    dataclass defaults  <-  YAML file (or the embedded default)  <-  dotted overrides

``osfl run CONFIG.yaml train.lr=0.01 partition.alpha=0.5``. Unknown keys at any
level are a :class:`~osfl.errors.ConfigError` that lists the valid keys of that
level; wrong types name the key and the value. ``--sweep key=v1,v2`` expands
into a grid of override sets (:func:`expand_sweeps`).

The local-training recipe is :class:`osfl.fl.training.TrainConfig` itself
(its defaults live in one place); per-method options are each method's own
``Config`` dataclass, validated by :func:`method_config`.
Reference: OmegaConf structured configs,
https://omegaconf.readthedocs.io/en/2.3_branch/structured_config.html
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from osfl.errors import ConfigError
from osfl.fl.secagg_config import SecAggPlusConfig
from osfl.fl.server_config import ServerConfig
from osfl.fl.train_config import TrainConfig
from osfl.registry import did_you_mean


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

    def params(self) -> dict[str, Any]:
        """Scheme parameters for ``make_federation`` (the ones that are set)."""
        named = {
            "alpha": self.alpha,
            "classes_per_client": self.classes_per_client,
            "min_partition_size": self.min_partition_size,
        }
        return {k: v for k, v in named.items() if v is not None} | dict(self.options)


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

    def __post_init__(self) -> None:
        if not self.seeds:
            raise ConfigError("seeds must list at least one seed, e.g. seeds=[0]")
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
        if self.partition.num_clients < 1:
            raise ConfigError(
                f"partition.num_clients must be >= 1, got {self.partition.num_clients}"
            )
        self._check_train_clients()
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


# --------------------------------------------------------------------------- loading
def _schema() -> DictConfig:
    return OmegaConf.structured(ExperimentConfig)


def _valid_keys(schema: DictConfig, full_key: str) -> list[str]:
    """The keys of the schema node that holds ``full_key`` (for error messages)."""
    parent = full_key.rsplit(".", 1)[0] if "." in full_key else ""
    node = OmegaConf.select(schema, parent) if parent else schema
    return sorted(node.keys()) if isinstance(node, DictConfig) else []


#: Hints for keys a user is likely to mistype the shape of (OmegaConf's own
#: messages speak of ListConfig, AnyNode and Dict[str, Dict[str, Any]]).
_SHAPE_HINTS = {
    "method": "`method` holds per-method options (method.fedavg.rounds=3); to choose the "
    "methods to run write methods=[fedavg] or methods=[fedavg,ensemble]",
    "methods": "methods is a list: write methods=[fedavg] or methods=[fedavg,ensemble]",
    "seeds": "seeds is a list: write seeds=[0] or seeds=[0,1,2]",
    "train_clients": "train_clients is a list of client ids: write train_clients=[0,1]",
    "audit": "audit is a list: write audit=[rlu] or audit=[rlu,llg+]",
    "sweep": 'sweep is a list: write "sweep=[partition.alpha=0.1,1.0]" or use --sweep',
    "defense": "defense is a mapping: write defense.sigma=0.05, or "
    '"defense={sigma: 0.05}" (YAML needs a space after each colon)',
}


def _translate(e: OmegaConfBaseException, schema: DictConfig, source: str) -> ConfigError:
    key = getattr(e, "full_key", "") or ""
    if isinstance(e, ConfigKeyError | AttributeError) or "not in" in str(e):
        parent = key.rsplit(".", 1)[0] if "." in key else "top level"
        keys = _valid_keys(schema, key)
        prefix = f"{parent}." if "." in key else ""
        hint = did_you_mean(key.rsplit(".", 1)[-1], keys, prefix)
        return ConfigError(
            f"unknown config key {key!r}{hint} ({source}); valid keys at {parent}: "
            f"{', '.join(keys) or '(none)'}"
        )
    if isinstance(e, ValidationError):
        first = str(e).splitlines()[0]
        hint = _SHAPE_HINTS.get(key.split(".")[0]) if "." not in key else None
        if hint is not None:
            return ConfigError(f"bad value for {key!r} ({source}): {hint}")
        if "could not be converted" in first:
            value = getattr(e, "value", None)
            want = first.rsplit(" to ", 1)[-1]
            return ConfigError(
                f"bad value for {key!r} ({source}): {value!r} is not a valid {want.lower()}"
            )
        return ConfigError(f"bad value for {key!r} ({source}): {first}")
    return ConfigError(f"invalid configuration ({source}): {str(e).splitlines()[0]}")


def default_config_text() -> str:
    """The embedded default experiment (``osfl/configs/default.yaml``)."""
    return resources.files("osfl").joinpath("configs/default.yaml").read_text()


def _yaml_text(text: str, source: str) -> tuple[DictConfig, str]:
    try:
        node = OmegaConf.create(text)
    except Exception as e:  # yaml.YAMLError and friends
        raise ConfigError(f"cannot parse {source}{yaml_error_where(e)}") from e
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{source} must hold a mapping of config keys at its top level")
    return node, source


def yaml_error_where(e: Exception) -> str:
    """``", line L, column C: problem (context at line L', column C')"`` of a
    YAML syntax error, in one line. PyYAML's own text spreads this over four
    lines and its first line is only the context ("while parsing a flow
    sequence"), without the position a user needs to find the mistake."""
    if not isinstance(e, yaml.MarkedYAMLError) or e.problem_mark is None:
        return f": {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    mark = e.problem_mark
    where = f", line {mark.line + 1}, column {mark.column + 1}: {e.problem}"
    if e.context:
        at = e.context_mark
        opened = f" at line {at.line + 1}, column {at.column + 1}" if at is not None else ""
        where += f" ({e.context}{opened})"
    return where


def _read_yaml(path: str | Path | None) -> tuple[DictConfig, str]:
    if path is None:
        return _yaml_text(default_config_text(), "embedded default.yaml")
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}{_not_found_hint(p)}")
    try:
        node = OmegaConf.load(p)
    except Exception as e:  # yaml.YAMLError and friends
        raise ConfigError(f"cannot parse {p}{yaml_error_where(e)}") from e
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{p} must hold a mapping of config keys at its top level")
    return node, str(p)


def _not_found_hint(p: Path) -> str:
    """Where a relative config path was looked for, and the way out for the
    repository's ``configs/`` read from another directory."""
    hint = "" if p.is_absolute() else f" (relative to {Path.cwd()})"
    if p.name == "default.yaml":
        return hint + (
            "; a bare `osfl run` (no config file) runs the packaged default, configs/default.yaml"
        )
    if p.parts and p.parts[0] == "configs":
        return hint + "; configs/ is in the osfl checkout: run from its root or give the full path"
    return hint


def _parse_overrides(overrides: Sequence[str]) -> DictConfig:
    bad = [o for o in overrides if "=" not in o or o.startswith("=")]
    if bad:
        raise ConfigError(f"override {bad[0]!r} must look like key=value (e.g. train.lr=0.01)")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except (OmegaConfBaseException, yaml.YAMLError) as e:  # a value is parsed as YAML
        raise ConfigError(f"cannot parse overrides {list(overrides)}: {e}") from e


def load_config(
    path: str | Path | None = None, overrides: Sequence[str] = (), *, embedded_default: bool = True
) -> ExperimentConfig:
    """Defaults <- YAML file (the embedded default when ``path`` is None and
    ``embedded_default``) <- dotted overrides, validated into an ExperimentConfig."""
    layers: list[tuple[DictConfig, str]] = []
    if path is not None or embedded_default:
        layers.append(_read_yaml(path))
    return _merge(layers, overrides)


def load_config_text(text: str, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """Like :func:`load_config` for YAML given as text (e.g. in Flower's run config)."""
    return _merge([_yaml_text(text, "YAML text")], overrides)


def _merge(layers: list[tuple[DictConfig, str]], overrides: Sequence[str]) -> ExperimentConfig:
    schema = _schema()
    if overrides:
        layers = [*layers, (_parse_overrides(overrides), "command-line overrides")]
    merged: DictConfig = schema
    for layer, source in layers:
        try:
            merged = OmegaConf.merge(merged, layer)  # type: ignore[assignment]
        except OmegaConfBaseException as e:
            raise _translate(e, schema, source) from e
    try:
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise _translate(e, schema, "merged config") from e
    except (TypeError, ValueError) as e:  # a dataclass __post_init__ refusing a value
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"invalid configuration: {e}") from e
    assert isinstance(cfg, ExperimentConfig)
    return cfg


def to_yaml(cfg: ExperimentConfig) -> str:
    """The resolved config as YAML: ``osfl run`` on it reproduces the run."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: Any) -> dict[str, Any]:
    """A plain JSON-able dict of a (nested) config dataclass."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]


# --------------------------------------------------------------------------- methods
def options_config(cls: type, spec: Mapping[str, Any], key: str) -> Any:
    """A free-form option mapping of the config (``defense: {...}``,
    ``byzantine: {...}``) as the dataclass ``cls``: unknown options are one
    ConfigError listing the valid ones (with a hint when YAML glued a colon
    to a key)."""
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(map(str, spec)) - set(valid))
    if unknown:
        hint = (
            f" (YAML needs a space after each colon: {key}={{name: value}}, or {key}.name=value)"
            if any(":" in k for k in unknown)
            else ""
        )
        raise ConfigError(
            f"unknown {key} option(s) {', '.join(unknown)}; valid: {', '.join(valid)}{hint}"
        )
    for f in dataclasses.fields(cls):  # an integer option given text: say what it must be
        value = spec.get(f.name)
        if f.type in (int, "int") and value is not None and not _is_int(value):
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:39] + "\u2026"
            raise ConfigError(f"{key}.{f.name} must be an integer, got {shown}")
    return cls(**dict(spec))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _merge_options(
    schema: DictConfig, overrides: Mapping[str, Any] | None, prefix: str, top: str
) -> Any:
    """``schema`` with ``overrides`` merged, as its dataclass. An unknown key at
    any level lists the valid keys of that level (``top`` says where a
    top-level key was unknown); a bad value names its dotted key under
    ``prefix``; the dataclass's own checks are prefixed too."""
    try:
        return OmegaConf.to_object(OmegaConf.merge(schema, dict(overrides or {})))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or ""
        if isinstance(e, ConfigKeyError | AttributeError) or "not in" in str(e):
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            where = f"in {prefix}.{parent}" if parent else top
            keys = _valid_keys(schema, key)
            leaf = key.rsplit(".", 1)[-1]
            hint = did_you_mean(leaf, keys)
            raise ConfigError(
                f"unknown option {leaf!r}{hint} {where}; valid: {', '.join(keys) or '(none)'}"
            ) from e
        raise ConfigError(f"{prefix}.{key}: {str(e).splitlines()[0]}") from e
    except (TypeError, ValueError) as e:  # ConfigError included: the dataclass's own checks
        # a check that names its key already (method.fens: ...) is not prefixed twice
        said = str(e)
        raise ConfigError(said if said.startswith(prefix) else f"{prefix}: {said}") from e


#: Options that methods' Configs once held beside the local-training recipe,
#: and the ``method_train.<name>`` key that holds each now.
_RECIPE_RENAMES = {"local_epochs": "epochs", "epochs_per_step": "epochs"}


def _leaf_paths(node: Mapping[str, Any], leaf: str, prefix: str = "") -> list[str]:
    """The dotted paths below the top level of a config tree that end in ``leaf``."""
    out = []
    for k, v in node.items():
        if isinstance(v, Mapping):
            if leaf in v:
                out.append(f"{prefix}{k}.{leaf}")
            out += _leaf_paths(v, leaf, f"{prefix}{k}.")
    return out


def _where_instead(schema: DictConfig, name: str, key: str) -> list[str]:
    """Where a top-level option ``key`` unknown to method ``name`` may be
    meant: the local-training recipe (``method_train.<name>.<key>``; FAFI's
    ``lr`` and FedAvg's ``local_epochs`` were once method options), the
    method's nested groups that hold ``key`` (``method.fafi.loss.tau``), and
    a group ``<a>`` holding ``<b>`` for a key ``<a>_<b>`` (``noise_std`` ->
    ``method.fafi.noise.std``)."""
    recipe = {f.name for f in dataclasses.fields(TrainConfig)}
    out = []
    if key in _RECIPE_RENAMES or key in recipe:
        out.append(f"method_train.{name}.{_RECIPE_RENAMES.get(key, key)}")
    tree = OmegaConf.to_container(schema)
    assert isinstance(tree, dict)
    group, _, leaf = key.partition("_")
    renamed = isinstance(tree.get(group), Mapping) and leaf in tree[group]
    nested = [f"{group}.{leaf}"] if renamed else []
    nested += _leaf_paths(tree, key)
    return out + [f"method.{name}.{p}" for p in nested]


def method_config(method_cls: type, overrides: Mapping[str, Any] | None = None) -> Any:
    """Build ``method_cls.Config`` with ``overrides`` (nested configs take nested
    mappings, e.g. ``{"distill": {"lr": 0.01}}``); an unknown key at any level
    lists the valid keys of that level, a bad value names its dotted key, and
    an unknown top-level key that the recipe or a nested group holds names
    the key to write instead."""
    name = getattr(method_cls, "name", method_cls.__name__)
    schema = OmegaConf.structured(method_cls.Config)
    for key in map(str, overrides or {}):
        instead = [] if key in schema else _where_instead(schema, name, key)
        if instead:
            write = " or ".join(f"{k}=..." for k in instead)
            raise ConfigError(f"unknown option {key!r} for method {name!r}: write {write}")
    return _merge_options(schema, overrides, f"method.{name}", f"for method {name!r}")


def method_train_config(
    base: TrainConfig, overrides: Mapping[str, Any] | None, name: str
) -> TrainConfig:
    """``base`` with the user's ``method_train.<name>`` ``overrides`` on top
    (unknown keys and bad values name their dotted key
    ``method_train.<name>.<key>``). The precedence of the layers below is the
    assembly's (:func:`osfl.assembly.train_recipe`)."""
    if not overrides:
        return base
    schema = OmegaConf.structured(base)
    return _merge_options(schema, overrides, f"method_train.{name}", f"in method_train.{name}")


def config_tree(config_cls: type) -> str:
    """The full option tree of a config dataclass with its defaults, as YAML."""
    return OmegaConf.to_yaml(OmegaConf.structured(config_cls))


@dataclass(frozen=True)
class OptionDoc:
    """One option of a config tree: its dotted ``key``, its ``default`` as YAML
    text and its one-line ``help`` (``""`` when undocumented)."""

    key: str
    default: str
    help: str


@functools.cache
def _doc_comments(klass: type) -> dict[str, str]:
    """The ``#:`` doc comments (Sphinx's form) on the lines right above each field
    declared in ``klass``'s own body, joined into one line each."""
    try:
        source = textwrap.dedent(inspect.getsource(klass))
    except (OSError, TypeError):  # no source (a class made at run time)
        return {}
    lines = source.splitlines()
    body = ast.parse(source).body[0]
    out = {}
    for node in body.body if isinstance(body, ast.ClassDef) else []:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            i, words = node.lineno - 2, []
            while i >= 0 and lines[i].strip().startswith("#:"):
                words.insert(0, lines[i].strip()[2:].strip())
                i -= 1
            if words:
                out[node.target.id] = " ".join(words)
    return out


def option_docs(config_cls: type) -> dict[str, str]:
    """Field name -> its ``#:`` doc comment, for ``config_cls`` and its dataclass
    bases (a subclass that redeclares a field to change its default keeps the
    base's description unless it writes its own)."""
    docs: dict[str, str] = {}
    for klass in reversed(config_cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_doc_comments(klass))
    return docs


def _default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _yaml_value(value: Any) -> str:
    if value is dataclasses.MISSING:
        return "(required)"
    if isinstance(value, str):
        return value if value else "''"
    if isinstance(value, tuple):
        value = list(value)
    text = str(yaml.safe_dump(value, default_flow_style=True, width=10_000))
    return text.strip().removesuffix("\n...").strip()


def config_options(config_cls: type, prefix: str = "") -> list[OptionDoc]:
    """Every leaf option of a config dataclass, nested groups as dotted keys
    (``distill.lr``), in declaration order, with its default and description
    (``osfl list --method NAME``)."""
    docs = option_docs(config_cls)
    out = []
    for f in dataclasses.fields(config_cls):
        default = _default_of(f)
        if dataclasses.is_dataclass(default) and not isinstance(default, type):
            out += _group_options(type(default), default, f"{prefix}{f.name}.")
            continue
        out.append(OptionDoc(f"{prefix}{f.name}", _yaml_value(default), docs.get(f.name, "")))
    return out


def _group_options(group_cls: type, default: Any, prefix: str) -> list[OptionDoc]:
    """A nested group's options with the defaults its parent gives it (e.g.
    DENSE's own ``distill.lr``, not :class:`DistillConfig`'s)."""
    return [
        dataclasses.replace(o, default=_yaml_value(_nested(default, o.key[len(prefix) :])))
        for o in config_options(group_cls, prefix)
    ]


def _nested(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


# --------------------------------------------------------------------------- sweeps
def _split_values(text: str) -> list[str]:
    """Split ``v1,v2,[a,b]`` on top-level commas (brackets group)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [v.strip() for v in out if v.strip()]


LIST_KEYS = ("seeds", "methods")


def expand_sweeps(sweeps: Sequence[str]) -> list[dict[str, str]]:
    """``["partition.alpha=0.1,1.0", "seeds=0,1"]`` -> the grid of override dicts.

    For the list-valued keys (``seeds``, ``methods``) one sweep value ``v``
    becomes ``[v]``, so a seed sweep is a grid dimension like any other and the
    report still averages over seeds.
    """
    axes: list[list[tuple[str, str]]] = []
    seen: set[str] = set()
    for s in sweeps:
        key, sep, values = s.partition("=")
        key = key.strip()
        if not sep or not key or not values.strip():
            raise ConfigError(
                f"--sweep {s!r} must look like key=v1,v2 (e.g. partition.alpha=0.1,1.0)"
            )
        if key in seen:
            raise ConfigError(f"--sweep names {key!r} twice; give all its values in one --sweep")
        seen.add(key)
        vals = _split_values(values)
        if key in LIST_KEYS:
            vals = [v if v.startswith("[") else f"[{v}]" for v in vals]
        axes.append([(key, v) for v in vals])
    return [dict(combo) for combo in itertools.product(*axes)] if axes else [{}]


def merge_sweeps(base: Sequence[str], extra: Sequence[str]) -> list[str]:
    """The config's sweep axes with ``extra`` (the command line's) replacing
    axes of the same key and adding new ones."""
    keys = {s.partition("=")[0].strip() for s in extra}
    return [s for s in base if s.partition("=")[0].strip() not in keys] + list(extra)


def sweep_label(point: Mapping[str, str]) -> str:
    """A short human label for a grid point, e.g. ``partition.alpha=0.1``."""
    return " ".join(f"{k}={v}" for k, v in point.items() if k != "seeds")
