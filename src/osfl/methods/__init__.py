"""FL methods, one module per family; importing this package registers them
in :data:`osfl.fl.method.METHODS`, and then lets the methods of other
installed packages join (``osfl.methods`` entry points, :mod:`.plugins`).

Baselines here: ``local`` (each client alone, the floor), ``fedavg`` (one-shot
with ``rounds=1``, else multi-round), ``fedprox`` and ``ensemble``. A method
class may set ``card = MethodCard(default_run=True, ...)`` to join the embedded default ``osfl run``
(ordered by ``default_order``).
"""

from osfl.fl.method import METHODS, Method
from osfl.methods import (
    eftvit,  # noqa: F401  (registers "eftvit")
    ensemble,
    fafi,  # noqa: F401  (registers "fafi")
    falcon,  # noqa: F401  (registers "falcon")
    fedavg,
    fedcgs,  # noqa: F401  (registers "fedcgs")
    feddc,  # noqa: F401  (registers "feddc")
    feddyn,  # noqa: F401  (registers "feddyn")
    fedmitr,  # noqa: F401  (registers "fedmitr")
    fedpft,  # noqa: F401  (registers "fedpft")
    fens,  # noqa: F401  (registers "fens")
    fusefl,  # noqa: F401  (registers "fusefl")
    generative,  # noqa: F401  (registers "priorkd")
    ghofl,  # noqa: F401  (registers "ghofl")
    intactofl,  # noqa: F401  (registers "intactofl")
    kd,  # noqa: F401  (registers deepinversion, adi, dense, coboosting, fedftg, feddf)
    local,
    peft,  # noqa: F401  (registers fedfull, fedhead, fedbias, fedprompt, fedlora, fedra, fedbfpt)
    scaffold,  # noqa: F401  (registers "scaffold")
)
from osfl.methods.clients import trained_client
from osfl.methods.ensemble import Ensemble, EnsemblePredictor
from osfl.methods.fedavg import FedAvg, FedProx
from osfl.methods.local import Local
from osfl.methods.plugins import METHOD_PLUGINS, adopt_method

__all__ = [
    "METHODS",
    "Ensemble",
    "EnsemblePredictor",
    "FedAvg",
    "FedProx",
    "Local",
    "Method",
    "default_methods",
    "ensemble",
    "fedavg",
    "local",
    "trained_client",
]


# Last, once every built-in is registered: other packages' methods (their
# ``osfl.methods`` entry points) join on the registry's first read, and one
# that takes a built-in's name is refused (docs/adding-a-method.md).
METHODS.accept_plugins(METHOD_PLUGINS, adopt_method)


def default_methods() -> list[str]:
    """Names of the methods that mark themselves ``default_run``, in table order."""
    chosen = [n for n in METHODS.names() if METHODS.get(n).card.default_run]
    return sorted(chosen, key=lambda n: (METHODS.get(n).card.default_order, n))
