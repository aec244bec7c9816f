"""osfl over Flower: the apps a deployment loads and the tools around them.

- :mod:`.apps`: ``server_app`` and ``client_app``, the objects a Flower app
  directory names; they build every job through :mod:`osfl.assembly` and the
  server writes a run directory like ``osfl run``;
- :mod:`.app_dir`: ``python -m osfl.flower_app DIR`` writes that directory
  (its ``pyproject.toml``) for ``flwr run``;
- :mod:`.local`: :class:`~osfl.flower_app.local.LocalFederation`, a real
  SuperLink + SuperNodes on loopback (what docs/flower.md tells a user to type);
- :mod:`.certs`: ``osfl flower certs DIR``, a throwaway CA, server
  certificate and SuperNode keys for a TLS rehearsal.

The runtimes themselves (Grid, loopback, simulation engine, SecAgg+) are in
:mod:`osfl.flower`, below this package; nothing there imports it. The package
itself imports nothing, so
that ``osfl flower certs`` does not load torch and Flower to make three files.
"""
