"""Label-recovery attacks on observed local updates (RLU and its baselines).

Importing this package registers every attack in :data:`ATTACKS`:
``rlu`` (Chen & Vikalo, ICML 2024), ``llg+`` (Wainakh et al., PETS 2022),
``zlg+`` (Geng et al., 2021), ``zlg+fedavg``
(Dimitrov et al., TMLR 2022: ZLG+ across FedAvg's local steps), ``irlg`` (Ma et al., ICLR 2023) and ``idlg``
(Zhao et al., 2020).
"""

from osfl.privacy.label_recovery import idlg, irlg, llg, rlu, zlg, zlg_fedavg  # noqa: F401  (registers)
from osfl.privacy.label_recovery.base import (
    ATTACKS,
    AttackInputs,
    LabelAttack,
    LabelRecoveryResult,
    LocalTraining,
    ObservationError,
    make_config,
    register_attack,
    resolve,
)
from osfl.privacy.label_recovery.simplex_lsq import largest_remainder, simplex_lstsq

__all__ = [
    "ATTACKS",
    "AttackInputs",
    "LabelAttack",
    "LabelRecoveryResult",
    "LocalTraining",
    "ObservationError",
    "largest_remainder",
    "make_config",
    "register_attack",
    "resolve",
    "simplex_lstsq",
]
