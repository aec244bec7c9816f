"""RLU's deterministic sub-steps against the RLU authors' public code.

Chen & Vikalo, "Recovering Labels from Local Updates in Federated
Learning", ICML 2024; github.com/CityChan/Recovering-Label-from-Update,
commit 54cc7921135b021d5a6218ebc4af61faf2ce4385. The repository has no
licence, so its code is not restated: ``tests/fixtures/label_recovery/generate.py``
runs the named functions and loops of a clone and ``rlu_code.json`` holds
their outputs (provenance in ``tests/fixtures/README.md``).

osfl implements the paper, not that code (docs/design.md §8): the code
replaces Eq. 10's least squares on the simplex by a per-class closed form,
estimates confidences by averaging softmax outputs instead of the Monte
Carlo Gaussian of Eq. 8, and has no SCAFFOLD/FedDyn/FedDC client ("will be
soon", its README), so h(t) of those schemes has no reference. What does
match, compared here:

- ρ(τ) of FedAvg + SGD with momentum (``Client.RLU``) and of FedProx
  (``Client_prox.RLU``): Table 1's closed forms, to 1e-12. Deliberate
  difference: the code's γ is ``args.gamma``, its learning-rate decay
  factor; osfl's is the optimiser's momentum (tested through an observation);
- the class-mean logits (``matrix``): osfl's Gaussian means, to 1e-12.
  Deliberate difference: ``learn_stat`` skips the last batch of the
  auxiliary loader; osfl uses every auxiliary sample (tested);
- the confidences the code averages over the other classes (``shift`` in
  ``estimate_static_RLU``) are minus the off-diagonal row means of osfl's
  coefficient matrix ``C`` where the logits of each class are a point mass
  (so that a mean of softmax outputs and Eq. 8's Monte Carlo agree; 1e-7);
- the code's per-class closed form (``estimated_entropy_from_grad``) and
  Eq. 10 give the same counts when every confidence is ``1/K``; elsewhere
  Eq. 10 returns the counts that generated the expected update and the
  closed form need not (the deliberate difference, tested).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.special

from osfl.fl.train_config import TrainConfig
from osfl.models import create_model
from osfl.privacy.label_recovery.base import resolve
from osfl.privacy.label_recovery.coefficients import LocalDynamics
from osfl.privacy.label_recovery.moments import (
    ConfidenceSampler,
    coefficient_matrix,
    fit_gaussians,
)
from osfl.privacy.label_recovery.schemes import local_dynamics
from osfl.privacy.label_recovery.simplex_lsq import largest_remainder, simplex_lstsq
from osfl.privacy.simulate import model_hparams, simulate_observation
from support.paths import FIXTURES

CODE = json.loads((FIXTURES / "label_recovery" / "rlu_code.json").read_text())


@pytest.mark.parametrize(
    "case", CODE["rho_sgdm"], ids=lambda c: f"g{c['gamma']}-m{c['local_epochs']}"
)
def test_rho_of_sgd_with_momentum_is_the_codes(case):
    dyn = LocalDynamics(lr=0.01, momentum=case["gamma"])
    np.testing.assert_allclose(dyn.rho(case["local_epochs"]), case["rho"], rtol=1e-12)


@pytest.mark.parametrize(
    "case", CODE["rho_fedprox"], ids=lambda c: f"mu{c['mu']}-m{c['local_epochs']}"
)
def test_rho_of_fedprox_is_the_codes(case):
    dyn = LocalDynamics(lr=case["lr"], prox=case["mu"])
    np.testing.assert_allclose(dyn.rho(case["local_epochs"]), case["rho"], rtol=1e-12)


def _observation(digits, steps: int, **train):
    tr, _ = digits
    model = create_model("lenet5", num_classes=10, img_size=16)
    tc = TrainConfig(steps=steps, batch_size=4, drop_last=True, **train)
    obs, _ = simulate_observation(
        model,
        tr.subset(range(4 * steps)),
        tc,
        model_spec=model_hparams("lenet5", {"img_size": 16}, 10),
    )
    return obs


def test_rho_is_read_from_the_observation_as_the_code_computes_it(digits_with_aux):
    """Through an Observation: the recorded optimiser momentum is the code's γ
    (``γ = 0.9, m = 5``), a FedProx μ with the recorded lr is its μ
    (``μ = 0.5, η = 0.01, m = 5``); plain SGD (the code with γ = 0) is ρ = 1."""
    sgdm = next(c for c in CODE["rho_sgdm"] if c["gamma"] == 0.9 and c["local_epochs"] == 5)
    obs = _observation(digits_with_aux, 5, lr=0.01, optimizer="sgdm", momentum=0.9)
    dyn, drift = local_dynamics(resolve(obs))
    np.testing.assert_allclose(dyn.rho(5), sgdm["rho"], rtol=1e-12)
    assert drift is None
    prox = next(c for c in CODE["rho_fedprox"] if c["mu"] == 0.5)
    obs = _observation(digits_with_aux, 5, lr=prox["lr"])
    assert local_dynamics(resolve(obs))[0].rho(5).tolist() == [1.0] * 5
    obs.hparams["fl"] = {"scheme": "fedprox", "mu": prox["mu"]}
    np.testing.assert_allclose(local_dynamics(resolve(obs))[0].rho(5), prox["rho"], rtol=1e-12)


def test_class_mean_logits_are_the_codes_matrix_without_its_last_batch():
    """``matrix(args, predictions, ground_truths)[i][j]`` is the mean logit ``i``
    of class ``j`` over every batch but the last; osfl's ``mean[j, i]`` over the
    same samples equals it, and over all samples equals the code's matrix
    called with one more (unused) batch appended."""
    c = CODE["class_means"]
    logits, labels = np.array(c["logits"]), np.array(c["labels"])
    k = c["n_classes"]
    seen = fit_gaussians(logits[:-1].reshape(-1, k), labels[:-1].ravel(), k)
    np.testing.assert_allclose(seen.mean.T, c["matrix"], rtol=0, atol=1e-12)
    every = fit_gaussians(logits.reshape(-1, k), labels.ravel(), k)
    np.testing.assert_allclose(every.mean.T, c["matrix_with_extra_batch"], rtol=0, atol=1e-12)
    assert not np.allclose(every.mean.T, c["matrix"])


def test_off_diagonal_confidences_are_the_codes_shift():
    """Point-mass logits (three samples of class n, all with logits ``mu[n]``):
    osfl's Monte Carlo S is softmax(mu[n]) in row n, and the code's
    ``shift[i] = mean_{n≠i} S[n, i]`` is ``−mean_{n≠i} C[i, n]``."""
    c = CODE["shift"]
    k, mu = c["n_classes"], np.array(c["class_logits"])
    y = np.repeat(np.arange(k), 3)
    gauss = fit_gaussians(mu[y], y, k)
    S = ConfidenceSampler(gauss, num_samples=64, seed=0).S()
    np.testing.assert_allclose(S, scipy.special.softmax(mu, axis=1), atol=1e-7)
    C = coefficient_matrix(S)
    off = (C.sum(axis=1) - np.diag(C)) / (k - 1)
    np.testing.assert_allclose(-off, c["shift"], atol=1e-7)


@pytest.mark.parametrize("case", CODE["closed_form"], ids=lambda c: f"{c['model']}-{c['counts']}")
def test_eq10_against_the_codes_closed_form(case):
    """The expected bias gradient of one step (mean loss over B samples) of a
    model whose class-n logits are ``class_logits[n]``: Eq. 10 on osfl's C
    recovers the counts exactly; the code's closed form equals them on the
    uniform model and, where the fixture says so, misses them otherwise."""
    logits = np.array(case["class_logits"])
    counts, total = case["counts"], sum(case["counts"])
    C = coefficient_matrix(scipy.special.softmax(logits, axis=1))
    u = -np.array(case["bias_grad"])  # Δb/η of one SGD step
    ours = largest_remainder(simplex_lstsq(C, u).z, total)
    assert ours.tolist() == counts
    if case["model"] == "uniform":
        assert case["code_counts"] == counts
    elif counts != [2, 2, 2, 2, 2]:
        assert case["code_counts"] != counts
