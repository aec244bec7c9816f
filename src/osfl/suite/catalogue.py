"""The catalogue of the GPU suite: the paper-scale runs a lent GPU should
make, in order of value (issues #32, #40).

``STEPS`` is the catalogue in the issue's order of value, one headline row
per seed paper, split into steps that fit one command at the rates a
lent GPU should reach (the planner, :mod:`osfl.suite.plan`, says at which
rate each comes in reach): FAFI Table 1 at α 0.1 (the paper's 50- and
100-epoch FAFI numbers first, as cheap rows; then the CE clients' and the
SALT clients' training as separate steps sharing the client cache, the SALT
clients in two ``train_clients`` parts before the step that finds them all
cached, all three planned into one lease or none), RLU Table 2 and Fig. 1,
the encoder (a ViT-Ti/16 kept in the repository once a lease made it),
FedMITR Table I, FALCON Table 2 with the closed-form heads, EFTViT Table 1
(one step per method), the MFU benchmark's variants, then more FAFI seeds. A step that uses some of
CIFAR-10's classes decodes only those from the pack (the image folder's
``classes`` option beside its ``data.classes``). Each step has a ``tiny``
form on digits (8 px; 16 px, LeNet-5's least, for the RLU scripts) that
``--dry-run`` runs on a CPU through the very same path.

The builders live by paper: :mod:`osfl.suite.fafi_steps` (FAFI),
:mod:`osfl.suite.paper_steps` (RLU, the encoder, FedMITR, FALCON, EFTViT,
MFU), with the pieces they share in :mod:`osfl.suite.step_parts`; this module
is the order of value, which reads against all of them at once.
"""

from __future__ import annotations

from osfl.suite.fafi_steps import fafi_row, fafi_step
from osfl.suite.paper_steps import (
    FROZEN_DATA,
    FROZEN_IMAGES,
    eftvit_step,
    fedmitr_step,
    frozen_step,
    mfu_step,
    pretrain_step,
    rlu_step,
)
from osfl.suite.steps import FORWARD, Step, Work


def _falcon_fit(epochs: tuple[int, int, int]) -> tuple[str, ...]:
    g, c, s = epochs
    return (
        f"method.falcon.generator_fit.epochs={g}",
        f"method.falcon.classifier_fit.epochs={c}",
        f"method.falcon.server_fit.epochs={s}",
    )


STEPS: tuple[Step, ...] = (
    fafi_step("salt", 0, epochs=50),
    fafi_step("salt", 0, epochs=100),
    *fafi_row(0),
    rlu_step("table2"),
    rlu_step("fig1"),
    pretrain_step(),
    fedmitr_step(),
    frozen_step(
        "frozen_closed_a0.1",
        "methods=[fedpft,fedcgs,ghofl]",
        {"fedpft": 59.40, "fedcgs": 81.53},
        # features of 7,500 images at 224-px views; closed-form heads and
        # FedPFT's mixtures (on the ViT-S/16, on an H200: 70 s, decoding included)
        Work({"vitti16_224": FORWARD * FROZEN_IMAGES, **FROZEN_DATA}, fixed_s=30.0),
    ),
    frozen_step(
        "falcon_a0.1",
        "methods=[falcon]",
        {"falcon": 79.93},
        # five views of every image (global + 2x2 regions), then the three fits
        Work(
            {"vitti16_224": 5 * FORWARD * FROZEN_IMAGES, **FROZEN_DATA},
            fixed_s=180.0,
            note="the three fits (generator, classifiers, server): guessed, not measured",
        ),
        tiny_extra=(
            "method.falcon.views={input_size: 8, window: 4, stride: 4}",
            "method.falcon.generator_model={depth: 1, heads: 2, components: 2}",
            *_falcon_fit((2, 2, 2)),
        ),
    ),
    *(eftvit_step(m) for m in ("fedhead", "fedlora", "eftvit")),
    mfu_step(),
    *(step for seed in (1, 2) for step in fafi_row(seed)),
)

SECTIONS: tuple[str, ...] = tuple(dict.fromkeys(s.section for s in STEPS))
