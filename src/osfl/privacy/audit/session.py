"""The audit of one (method, seed) run: an observer to attach, then
:meth:`AuditSession.finish` scores what it recorded.

The auxiliary set is ``aux_per_class`` images per class drawn (seeded) from
the test split, the paper's setting (§4: 100 per class); attacks see it
through the clients' evaluation transform.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from osfl.privacy.audit.recorder import AuditRecorder
from osfl.privacy.audit.scoring import aux_set, score_observations
from osfl.privacy.audit.spec import AuditSpec

if TYPE_CHECKING:
    from osfl.data.imageset import ImageSet
    from osfl.fl.context import RunContext
    from osfl.fl.method import Method

OBSERVATIONS_DIR = "observations"
RECORDING = "recording.json"


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_.+" else "_" for ch in text) or "run"


class AuditSession:
    """The audit of one (method, seed) run: an observer to attach, then :meth:`finish`.

    ``root`` (the run directory) receives the observations under
    ``observations/<point>-<method>-seed<seed>/`` with a ``recording.json``
    naming them, so ``osfl audit RUN_DIR`` can score them again later.
    """

    def __init__(
        self,
        spec: AuditSpec,
        method: Method,
        run: RunContext,
        test: ImageSet,
        *,
        root: str | Path | None = None,
        context: Mapping[str, Any] | None = None,
    ):
        self.spec = spec
        self.run = run
        self.test = test
        self.context = dict(context or {})
        rounds = None
        if spec.rounds is not None:
            rounds = sorted({r % method.rounds if r < 0 else r for r in spec.rounds})
        self.dir: Path | None = None
        if root is not None and spec.save:
            point = self.context.get("point") or ""
            name = f"{point}-" if point else ""
            name += f"{self.context.get('method', method.name)}-seed{self.context.get('seed', 0)}"
            self.dir = Path(root) / OBSERVATIONS_DIR / _slug(name)
        self.recorder = AuditRecorder(method, run, self.dir, spec.clients, rounds)

    def finish(self) -> dict[str, Any]:
        """Score the attacks on what was recorded; the record's ``audit`` entry."""
        obs = self.recorder.observations
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            doc = {**self.context, "observations": len(obs)}
            (self.dir / RECORDING).write_text(json.dumps(doc, indent=2, default=str))
        if not self.spec.attacks:
            return {"recorded": len(obs)}
        aux = aux_set(self.test, self.spec.aux_per_class, self.spec.aux_seed)
        device = self.spec.device or self.run.device
        return score_observations(
            obs, self.spec.attacks, aux, transform=self.run.eval_transform, device=device
        )
