"""osfl over Flower: the apps a deployment loads and the tools around them.

- :mod:`.apps`: ``server_app`` and ``client_app``, the objects a Flower app
  directory names; they build every job through :mod:`osfl.assembly` and the
  server writes a run directory like ``osfl run``;
- :mod:`.app_dir`: ``python -m osfl.flower_app DIR`` writes that directory
  (its ``pyproject.toml``) for ``flwr run``;
- :mod:`.local`: :class:`~osfl.flower_app.local.LocalFederation`, a real
  SuperLink + SuperNodes on loopback (what docs/flower.md tells a user to type).

The runtimes themselves (Grid, loopback, simulation engine) are in
:mod:`osfl.fl.runtime`; nothing there imports this package.
"""

from osfl.flower_app.app_dir import APP_NAME, app_pyproject, main, write_app

__all__ = ["APP_NAME", "app_pyproject", "main", "write_app"]
