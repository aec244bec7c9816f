"""Which YAML layers a run's config is made of: a file's ``base:`` and the files it names.

A user who writes a YAML holding only ``train: {epochs: 1}`` means "the
default run, one epoch", not "the dataclass defaults" (plain SGD at lr 0.01,
the partition scheme's own alpha): issue "What a researcher expects, round
three". So a config file layers on a base, named by its top-level ``base:``
key, Hydra's ``defaults:`` list in one word:

- ``base: default``: the packaged default experiment (``osfl run`` with no
  file); this is the base of a file that names none;
- ``base: none``: only the dataclass defaults (every ``configs/*.yaml`` of
  the repository says so: each is complete, and its numbers were made that
  way; the ``config.yaml`` a run directory keeps says so too, since it holds
  every key);
- ``base: other.yaml`` (relative to the file naming it) or a list of such
  names, composed in order before the file itself.

Several files compose in order (``osfl run a.yaml b.yaml key=value``): the
first file with its bases, then each later file with its own, then the
overrides. Only the first layer may be the implied default: a later file (or
a second base) that names no base adds to what came before rather than
starting again from the default. A file that is its own base, directly or
through others, is a cycle and refused; a file reached again on another path
(a diamond: two bases on one common file) is layered once, where it was
first reached, and read once: resolution is linear in the number of files
(a file naming one base twice, sixteen levels deep, used to be read 2^16
times). A base must be a ``.yaml`` / ``.yml`` file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from omegaconf import DictConfig, ListConfig

from osfl.errors import ConfigError

#: the key naming a file's base
BASE_KEY = "base"
#: ``base:`` value for the packaged default experiment
PACKAGED = "default"
#: ``base:`` value for the dataclass defaults alone
NOTHING = "none"

Layer = tuple[DictConfig, str]
#: reads one YAML file: (its mapping, its name for error messages)
ReadFile = Callable[[Path], Layer]


def pop_base(node: DictConfig, source: str, absent: str) -> list[str]:
    """The bases ``node`` names (removed from it: ``base`` is not a config
    key); ``[absent]`` when it names none."""
    if BASE_KEY not in node:
        return [absent]
    value = node.pop(BASE_KEY)
    names = list(value) if isinstance(value, ListConfig | list) else [value]
    if not names or not all(isinstance(n, str) and n.strip() for n in names):
        raise ConfigError(
            f"{source}: base must be '{PACKAGED}', '{NOTHING}', a YAML file or a list of "
            f"them; got {value!r}"
        )
    return [str(n) for n in names]


def config_layers(
    paths: Sequence[Path], read: ReadFile, packaged: Callable[[], Layer]
) -> list[Layer]:
    """The layers of ``paths`` in the order they merge (module docstring).
    Each distinct file (by resolved path) is read and layered once, so the
    work is linear in the number of files however often they are named."""
    walk = _Walk(read, packaged)
    for path in paths:
        walk.add(path, ())
    return walk.layers


class _Walk:
    """One resolution: the layers so far and the files already layered."""

    def __init__(self, read: ReadFile, packaged: Callable[[], Layer]) -> None:
        self.read, self.packaged = read, packaged
        self.layers: list[Layer] = []
        self.placed: set[Path] = set()

    def add(self, path: Path, chain: tuple[Path, ...]) -> None:
        """Append ``path``'s bases, then ``path``, to the layers. A file
        already layered adds nothing more: it stays where it was first
        placed (a diamond, two files on one common base, layers the base
        once, under both). A file naming no base stands on the packaged
        default only if nothing came before it: a default layered again
        later would undo what the files before it set."""
        key = path.resolve()
        if key in chain:
            shown = " -> ".join(str(p) for p in (*chain, key))
            raise ConfigError(f"config bases form a cycle: {shown}")
        if key in self.placed:
            return
        node, source = self.read(path)
        for name in pop_base(node, source, PACKAGED if not self.layers else NOTHING):
            if name == PACKAGED:
                self.layers.append(self.packaged())
            elif name != NOTHING:
                self.add(path.parent / _base_file(name, source), (*chain, key))
        self.placed.add(key)
        self.layers.append((node, source))


#: What a ``base:`` file may be called: a YAML config, nothing else. A base
#: naming ``/etc/passwd`` or a key file is refused before it is read, so no
#: error can show a line of it.
YAML_SUFFIXES = (".yaml", ".yml")


def _base_file(name: str, source: str) -> str:
    if not name.lower().endswith(YAML_SUFFIXES):
        raise ConfigError(
            f"{source}: base {name!r} is not a YAML file; a base is '{PACKAGED}', "
            f"'{NOTHING}' or a file ending in .yaml or .yml"
        )
    return name
