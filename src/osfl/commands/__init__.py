"""The ``osfl`` commands, one module per command group, each with its
``cmd_*`` function(s) and an ``add_parser(sub)`` that adds its sub-parser(s);
:mod:`osfl.cli` puts them together. Shared: :mod:`osfl.commands.common`."""
