"""Privacy audits of a run: record what the server saw, score attacks on it.

An honest-but-curious server sees, per client and round, the broadcast, the
upload and the public training hyper-parameters (docs/design.md §2: an
:class:`~osfl.fl.observation.Observation`); for the stateful schemes it also
knows the scheme's history (SCAFFOLD's control variates, FedDyn's gradient
state, FedDC's drift and updates), which RLU's ``h`` term reads [Chen &
Vikalo, ICML 2024, Table 1, Appendix A.6-A.9]. The parts:

- :mod:`.spec`: what an audit records and scores (the config's ``audit`` list);
- :mod:`.recorder`: :class:`AuditRecorder`, the project's
  :class:`~osfl.fl.observers.ObservationRecorder` with the step-label truth;
- :mod:`.scoring`: label-recovery attacks scored against that truth with
  cAcc/iAcc (Appendix B.4), mean ± std over the observed clients and rounds;
- :mod:`.session`: :class:`AuditSession`, both wired into one run
  (``osfl run ... audit=[rlu, llg+]``);
- :mod:`.tables`: the audit table for ``summary.md`` and the terminal.

Re-scoring a recorded run directory (``osfl audit RUN_DIR``) needs the run's
data and transforms, so it lives above the assembly layer
(:mod:`osfl.audit_dir`). See docs/privacy.md, "What is recorded" and
"Auditing a run".
"""

from osfl.privacy.audit.recorder import AuditRecorder, audit_truth, observation_hparams
from osfl.privacy.audit.scoring import aux_set, score_observations
from osfl.privacy.audit.session import OBSERVATIONS_DIR, RECORDING, AuditSession
from osfl.privacy.audit.spec import AttackSpec, AuditSpec, parse_audit
from osfl.privacy.audit.tables import (
    AUDIT_HEADING,
    audit_markdown,
    audit_rich_table,
    audit_rows,
)

__all__ = [
    "AUDIT_HEADING",
    "OBSERVATIONS_DIR",
    "RECORDING",
    "AttackSpec",
    "AuditRecorder",
    "AuditSession",
    "AuditSpec",
    "audit_markdown",
    "audit_rich_table",
    "audit_rows",
    "audit_truth",
    "aux_set",
    "observation_hparams",
    "parse_audit",
    "score_observations",
]
