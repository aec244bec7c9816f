"""``hf-hub:`` checkpoint ids: a file on the Hugging Face Hub, downloaded only
when asked for by such an id.

Syntax (timm's ``hf-hub:`` prefix, ``timm/models/_hub.py``, plus an optional
file path)::

    hf-hub:<owner>/<name>[@<revision>][/<file>]

    hf-hub:facebook/dinov2-small                   -> model.safetensors, else pytorch_model.bin
    hf-hub:timm/vit_small_patch14_dinov2.lvd142m   -> timm's copy (timm names)
    hf-hub:google/vit-base-patch16-224-in21k@main/pytorch_model.bin

Only ``.safetensors`` / ``.bin`` / ``.pth`` / ``.pt`` files are fetched and they
are read like local files (never unpickled). ``huggingface_hub`` stays an
optional dependency: it is imported here, inside :func:`resolve_checkpoint`,
and only for an ``hf-hub:`` id; offline, it serves files already in its cache
(``HF_HUB_OFFLINE=1``). Anything that is not an ``hf-hub:`` id is a local path.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from osfl.errors import ConfigError

HUB_PREFIX = "hf-hub:"
#: Tried in order when the id names no file (a repository's usual weight files).
DEFAULT_FILES = ("model.safetensors", "pytorch_model.bin")
_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt")
_ID = re.compile(
    r"^hf-hub:(?P<repo>[\w.-]+/[\w.-]+)(?:@(?P<revision>[\w.-]+))?(?:/(?P<file>[^@]+))?$"
)


@dataclass(frozen=True)
class HubId:
    repo_id: str
    revision: str | None
    filename: str | None

    def __str__(self) -> str:
        rev = f"@{self.revision}" if self.revision else ""
        return f"{HUB_PREFIX}{self.repo_id}{rev}" + (f"/{self.filename}" if self.filename else "")


def is_hub_id(spec: object) -> bool:
    return isinstance(spec, str) and spec.startswith(HUB_PREFIX)


def parse_hub_id(spec: str) -> HubId:
    """``hf-hub:owner/name[@revision][/file]`` -> :class:`HubId`, or a ConfigError
    that shows the syntax."""
    m = _ID.match(spec)
    if m is None:
        raise ConfigError(
            f"bad hub id {spec!r}; the syntax is hf-hub:<owner>/<name>[@<revision>][/<file>], "
            "e.g. hf-hub:facebook/dinov2-small"
        )
    filename = m.group("file")
    if filename is not None and not filename.lower().endswith(_SUFFIXES):
        raise ConfigError(
            f"hub id {spec!r}: {filename!r} is not a weights file ({', '.join(_SUFFIXES)})"
        )
    return HubId(m.group("repo"), m.group("revision"), filename)


def _hf_hub_download(repo_id: str, filename: str, revision: str | None) -> str:
    """``huggingface_hub.hf_hub_download``, imported only now (optional dependency)."""
    try:
        from huggingface_hub import hf_hub_download  # optional: huggingface_hub
    except ImportError as e:
        raise ConfigError(
            f"loading hf-hub:{repo_id} needs the optional package huggingface_hub "
            "(pip install huggingface_hub); or download the weights file yourself and "
            "pass its local path"
        ) from e
    return str(hf_hub_download(repo_id, filename, revision=revision))


def resolve_checkpoint(spec: str | os.PathLike[str]) -> Path:
    """The local file behind ``spec``: ``spec`` itself for a path; for an
    ``hf-hub:`` id the downloaded (or cached) file. Errors are ConfigErrors that
    say what was tried."""
    if not is_hub_id(spec):
        return Path(spec)
    hub = parse_hub_id(str(spec))
    candidates = (hub.filename,) if hub.filename else DEFAULT_FILES
    failures: list[str] = []
    for filename in candidates:
        try:
            return Path(_hf_hub_download(hub.repo_id, filename, hub.revision))
        except ConfigError:
            raise
        except Exception as e:  # not found, offline, gated, network: try the next name
            failures.append(f"{filename}: {type(e).__name__}: {e}".splitlines()[0])
    raise ConfigError(
        f"could not fetch {hub}: {'; '.join(failures)}. Offline, download the file elsewhere "
        "and pass its local path; for another file name use hf-hub:<owner>/<name>/<file>"
    )
