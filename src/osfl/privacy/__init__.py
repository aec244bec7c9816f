"""Privacy audits of what an honest-but-curious server sees (docs/design.md §2, §8).

- :data:`ATTACKS` / :func:`run_attack` (+ :func:`resolve_inputs`, to check an
  Observation once and share it between attacks): label recovery from an
  :class:`~osfl.fl.observation.Observation` — ``rlu``, ``llg+``, ``zlg+``,
  ``irlg``, ``idlg`` (:mod:`osfl.privacy.label_recovery`);
- :mod:`osfl.privacy.metrics`: cAcc/iAcc (RLU Appendix B.4), PSNR/SSIM/LPIPS;
- :mod:`osfl.privacy.inversion`: gradient inversion (Inverting Gradients);
- :mod:`osfl.privacy.simulate`: an Observation without the FL runtime;
- :data:`RECONSTRUCTION_ATTACKS` / :func:`run_reconstruction_attack`: image
  reconstruction from uploaded token sequences (``token_inversion``,
  :mod:`osfl.privacy.token_inversion`, FALCON Table 5), fed through a
  :class:`TokenSource` (:mod:`osfl.privacy.token_source`: plain tensors, or a
  method's adapter built on the method side).

Nothing here imports :mod:`osfl.methods`.

See docs/privacy.md for the threat model and how to audit a run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from osfl.privacy.label_recovery import (
    ATTACKS,
    AttackInputs,
    LabelAttack,
    LabelRecoveryResult,
    ObservationError,
    make_config,
)
from osfl.privacy.label_recovery import resolve as resolve_inputs
from osfl.privacy.token_inversion import RECONSTRUCTION_ATTACKS, run_reconstruction_attack
from osfl.privacy.token_source import CallableTokenEncoder, FixedTokens, TokenEncoder, TokenSource

if TYPE_CHECKING:
    import torch
    from torch import nn

    from osfl.data.imageset import ImageSet
    from osfl.fl.observation import Observation


def run_attack(
    name: str,
    observation: Observation | AttackInputs,
    aux: ImageSet | None = None,
    *,
    model: nn.Module | None = None,
    transform: Any = None,
    device: torch.device | str = "cpu",
    steps: int | None = None,
    **options: Any,
) -> LabelRecoveryResult:
    """Run the registered attack ``name`` on one Observation.

    ``aux``: the server's auxiliary ImageSet (RLU, LLG+, ZLG+ need one);
    ``model``: an ``nn.Module`` of the observed architecture when the
    observation does not name it (``hparams.model``); ``transform``: uint8 ->
    model input (the clients' evaluation transform; default ``x/255``);
    ``steps``: override the number of local steps; ``**options``: the attack's
    config fields (e.g. ``num_samples=``, ``posterior_iters=`` for RLU).
    Unknown names or options raise :class:`~osfl.errors.ConfigError`.
    """
    cls = ATTACKS.get(name)
    attack = cls(make_config(cls, options))
    return attack.recover(
        observation, aux, model=model, transform=transform, device=device, steps=steps
    )


__all__ = [
    "ATTACKS",
    "RECONSTRUCTION_ATTACKS",
    "AttackInputs",
    "CallableTokenEncoder",
    "FixedTokens",
    "LabelAttack",
    "LabelRecoveryResult",
    "ObservationError",
    "TokenEncoder",
    "TokenSource",
    "resolve_inputs",
    "run_attack",
    "run_reconstruction_attack",
]
