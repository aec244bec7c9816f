"""Regenerate the frozen-encoder reference vectors (tests/data/README.md, "frozen").

    python tests/data/frozen/make_reference.py GHOFL_REPO FEDCGS_REPO

``GHOFL_REPO``: a git checkout of github.com/FabioTur-dev/One-Shot-FL at
commit fd6daf2e0f98ecbc079f96966240c740a4b901f2; ``FEDCGS_REPO``: of
github.com/Yuqin-G/FedCGS at commit 25402e60e1b242e965634e2b6b4b3056eec4595c
(``git clone`` + ``git checkout``, or a bare mirror: the files are read with
``git show COMMIT:PATH``). Neither repository states a licence, so none of
their code is copied here: this script reads their files, executes the
functions named below unmodified (except where said) on the fixed inputs of
``inputs.safetensors`` and stores only the values they return.

GH-OFL (``server/GH_OFL_server.py``, ``client/run_client_backbones.py``):
``aggregate_client_stats_x`` (per client, ``model`` = identity),
``aggregate_clients_x`` (its ``safe_load_pt`` replaced by an in-memory
lookup), ``logits_nbdiag_cpu``, ``logits_lda_cpu``, ``QDAFullFastGPU`` (on
the CPU; also a float64 copy: its source with ``torch.float32`` replaced by
``torch.float64``), ``fisher_subspace``, ``synthesize_fisher``,
``build_gaussians_fisher``, ``lda_scores_f``, ``nb_scores_f``; settings of
the README's CIFAR-10 config (``configs/cifar10.yaml``).

FedCGS (``main_fedcgs.py`` lines 57-95, the client loop and the server's
statistics, and the body of its ``for gamma in gamma_list`` loop, lines
99-102, run for γ = 0 and for the γ equal to osfl's default ridge;
``utils_fl.eval``, whose ``test`` is replaced by a function that keeps the
classifier it is given).
"""

from __future__ import annotations

import ast
import copy
import math
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

HERE = Path(__file__).resolve().parent
GHOFL_COMMIT = "fd6daf2e0f98ecbc079f96966240c740a4b901f2"
FEDCGS_COMMIT = "25402e60e1b242e965634e2b6b4b3056eec4595c"

#: GH-OFL's README CIFAR-10 config (configs/cifar10.yaml at GHOFL_COMMIT).
LDA_SHRINK, QDA_SHRINK = 0.05, 0.1
FISHER_ENERGY, FISHER_MAX_K = 0.995, 16
SYN_SHRINK, SYN_TAU, SYN_TAU_CLIP, SEED = 0.05, 0.9, (0.6, 1.4), 42
#: Synthetic features per class: a multiple of 16, so that torch draws the same
#: normals in one call (osfl) as in one call per class (the authors).
SYN_PER_CLASS = 32
#: osfl's FedCGS default ridge λ (Σ̂ = Σ + λ·tr(Σ)/D·I).
FEDCGS_SHRINKAGE = 1e-4


def show(repo: str, commit: str, path: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", git_dir(repo), "show", f"{commit}:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def git_dir(repo: str) -> str:
    p = Path(repo)
    return str(p / ".git") if (p / ".git").exists() else str(p)


def top_level(source: str, names: set[str]) -> str:
    """The source of the named top-level functions, classes and assignments."""
    tree = ast.parse(source)
    lines = source.splitlines()
    out, found = [], set()
    for node in tree.body:
        name = getattr(node, "name", None)
        if isinstance(node, ast.Assign):
            name = getattr(node.targets[0], "id", None)
        if name in names:
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            out.append("\n".join(lines[start - 1 : node.end_lineno]))
            found.add(name)
    assert found == names, names - found
    # their annotations are not evaluated (typing names need no import)
    return "from __future__ import annotations\n\n" + "\n\n".join(out)


def namespace() -> dict[str, Any]:
    return {
        "torch": torch,
        "nn": nn,
        "F": F,
        "np": np,
        "math": math,
        "random": random,
        "copy": copy,
        "__name__": "reference",
    }


GHOFL_SERVER = {
    "MIN_EPS",
    "set_seed",
    "symmetrize",
    "shrink_cov",
    "invsqrt_psd",
    "aggregate_clients_x",
    "logits_nbdiag_cpu",
    "logits_lda_cpu",
    "QDAFullFastGPU",
    "fisher_subspace",
    "synthesize_fisher",
    "build_gaussians_fisher",
    "lda_scores_f",
    "nb_scores_f",
}


def ghofl(repo: str, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    server = show(repo, GHOFL_COMMIT, "server/GH_OFL_server.py")
    client = show(repo, GHOFL_COMMIT, "client/run_client_backbones.py")
    ns = namespace()
    exec(top_level(server, GHOFL_SERVER), ns)
    exec(top_level(client, {"aggregate_client_stats_x"}), ns)
    qda64 = top_level(server, {"QDAFullFastGPU"}).replace("torch.float32", "torch.float64")
    exec(qda64.replace("class QDAFullFastGPU", "class QDAFullFast64"), ns)
    out: dict[str, torch.Tensor] = {}
    for tag in ("dense", "sparse"):
        f, y, cl = inputs[f"{tag}.features"], inputs[f"{tag}.labels"], inputs[f"{tag}.clients"]
        c = int(inputs[f"{tag}.num_classes"])
        uploads = {}
        for k in range(int(cl.max()) + 1):
            idx = (cl == k).nonzero().flatten()
            batches = [(f[idx[i : i + 8]], y[idx[i : i + 8]]) for i in range(0, len(idx), 8)]
            stats = ns["aggregate_client_stats_x"](
                nn.Identity(), batches, c, f.shape[1], torch.device("cpu"), "cifar10"
            )
            uploads[f"client_{k}.pt"] = stats
            for key, t in stats.items():
                out[f"{tag}.client{k}.{key}"] = t
        ns["safe_load_pt"] = uploads.get
        agg = ns["aggregate_clients_x"](sorted(uploads), num_classes=c)
        for key in ("mu", "pri", "logp", "Sigma_pool", "Var_diag", "Sigma_cls"):
            out[f"{tag}.{key}"] = agg[key]
    # the heads, on the dense fixture (every class with ≥ 2 samples)
    agg_keys = ("mu", "pri", "logp", "Sigma_pool", "Var_diag", "Sigma_cls")
    mu, pri, logp, pool, var, scls = (out[f"dense.{k}"] for k in agg_keys)
    x = inputs["dense.test"]
    counts = out["dense.client0.N_per_class"] * 0
    for k in range(int(inputs["dense.clients"].max()) + 1):
        counts = counts + out[f"dense.client{k}.N_per_class"]
    n = counts.double()[:, None]
    out["nb_logits"] = ns["logits_nbdiag_cpu"](x, mu, var, logp)
    # the same function given osfl's (unbiased) variances: the deliberate difference
    out["nb_logits_unbiased"] = ns["logits_nbdiag_cpu"](x, mu, var * n / (n - 1), logp)
    out["lda_logits"] = ns["logits_lda_cpu"](x, mu, pool, logp, LDA_SHRINK)
    # the server's evaluation path: Σ_W shrunk, + MIN_EPS, then logits_lda_cpu(shrink=0)
    shrunk = ns["symmetrize"](ns["shrink_cov"](pool, LDA_SHRINK)) + ns["MIN_EPS"] * torch.eye(
        pool.shape[0], dtype=torch.float64
    )
    out["lda_logits_eval"] = ns["logits_lda_cpu"](x, mu, shrunk, logp, 0.0)
    cpu = torch.device("cpu")
    out["qda_logits32"] = ns["QDAFullFastGPU"](mu, scls, logp, QDA_SHRINK, cpu).logits(x.float())
    out["qda_logits64"] = ns["QDAFullFast64"](mu, scls, logp, QDA_SHRINK, cpu).logits(x)
    v, kf, lam = ns["fisher_subspace"](mu, pri, pool, LDA_SHRINK, FISHER_ENERGY, FISHER_MAX_K)
    out["fisher_V"], out["fisher_lam"] = v, lam
    out["fisher_k"] = torch.tensor(kf)
    for use_class, key in ((True, "class"), (False, "pooled")):
        z, zy, _ = ns["synthesize_fisher"](
            mu, pool, scls, v, SYN_PER_CLASS, SYN_SHRINK, SYN_TAU, SYN_TAU_CLIP, SEED, use_class
        )
        out[f"synthetic_{key}"], out[f"synthetic_{key}_labels"] = z, zy
    g = ns["build_gaussians_fisher"](mu, pri, pool, v, LDA_SHRINK, cpu)
    out["fisher_mu_f"], out["fisher_sig_f_pool"] = g["mu_f"], g["Sig_f_pool"]
    out["fisher_sigma2_nb"] = torch.tensor(g["sigma2_nb"], dtype=torch.float64)
    zf = (x @ v).to(torch.float32)  # as evaluate_streaming
    out["fisher_lda_scores"] = ns["lda_scores_f"](zf, g)
    out["fisher_nb_scores"] = ns["nb_scores_f"](zf, g)
    return {k: t.contiguous() for k, t in out.items()}


def between(source: str, start: str, stop: str | None) -> str:
    lines = source.splitlines()
    i = next(j for j, s in enumerate(lines) if s.strip() == start)
    j = next(k for k in range(i + 1, len(lines)) if lines[k].strip() == stop) if stop else None
    return textwrap.dedent("\n".join(lines[i:j]))


class _Features(nn.Module):
    """FedCGS's ``model(X, return_features=True)`` for features given as X; a
    ``fc`` layer for ``utils_fl.eval`` to fill."""

    def __init__(self, d: int, c: int):
        super().__init__()
        self.fc = nn.Linear(d, c)

    def forward(self, x: torch.Tensor, return_features: bool = False) -> Any:
        return None, x


def fedcgs(repo: str, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    main = show(repo, FEDCGS_COMMIT, "main_fedcgs.py")
    utils = show(repo, FEDCGS_COMMIT, "utils_fl.py")
    clients_and_server = between(
        main, "for i in range(len(train_loader_list)):", "gamma_list = [0]"
    )
    gamma_body = textwrap.dedent(
        "\n".join(between(main, "for gamma in gamma_list:", None).splitlines()[1:])
    )
    f, y, cl = inputs["dense.features"], inputs["dense.labels"], inputs["dense.clients"]
    c, d = int(inputs["dense.num_classes"]), f.shape[1]
    loaders = []
    for k in range(int(cl.max()) + 1):
        idx = (cl == k).nonzero().flatten()
        loaders.append([(f[idx[i : i + 8]], y[idx[i : i + 8]]) for i in range(0, len(idx), 8)])
    kept: list[nn.Module] = []
    ns = namespace()
    exec(top_level(utils, {"eval"}), ns)
    ns.update(
        train_loader_list=loaders,
        model=_Features(d, c),
        device=torch.device("cpu"),
        num_classes=c,
        num_d=d,
        cs_l=[],
        cc_l=[],
        Ax_l=[],
        Bx_l=[],
        test_loader=None,
        test=lambda model, loader: kept.append(model),
    )
    exec(clients_and_server, ns)
    out: dict[str, torch.Tensor] = {}
    for k in range(len(loaders)):
        for key in ("cs", "cc", "Ax", "Bx"):
            out[f"client{k}.{key}"] = ns[f"{key}_l"][k]
    for key in ("Sx", "class_means", "N"):
        out[key] = ns[key].reshape(-1) if key == "N" else ns[key]
    spread = float(torch.trace(ns["Sx"])) / d
    for tag, gamma in (("gamma0", 0.0), ("ridge", FEDCGS_SHRINKAGE * spread)):
        ns["gamma"] = gamma
        exec(gamma_body, ns)
        out[f"{tag}.S_inv"] = ns["S_inv"]
        out[f"{tag}.fc_weight"] = kept[-1].fc.weight.data.clone()
        out[f"{tag}.fc_bias"] = kept[-1].fc.bias.data.clone()
        out[f"{tag}.gamma"] = torch.tensor(gamma, dtype=torch.float64)
    return {k: t.contiguous() for k, t in out.items()}


def make_inputs() -> dict[str, torch.Tensor]:
    """Two small feature sets, float64 values exactly representable in float32
    (the authors' clients cast their backbone's features to float32 first).
    ``dense``: 4 classes of 9–14 samples in 5 dimensions, each class its own
    covariance, spread over 3 clients, and 6 test points. ``sparse``: the same
    plus a class with one sample and a class with none (6 classes)."""
    rng = np.random.default_rng(20260303)
    c, d = 4, 5
    means = rng.normal(0.0, 1.5, (c, d))
    mix = rng.normal(0.0, 0.5, (c, d, d)) + np.eye(d)[None] * rng.uniform(0.5, 1.5, (c, 1, 1))
    sizes = [14, 11, 9, 12]
    f = np.concatenate([means[k] + rng.normal(size=(n, d)) @ mix[k] for k, n in enumerate(sizes)])
    y = np.repeat(np.arange(c), sizes)
    order = rng.permutation(len(y))
    f, y = f[order], y[order]
    clients = rng.integers(0, 3, len(y))
    test = np.concatenate([means[k] + 0.8 * rng.normal(size=(2, d)) @ mix[k] for k in range(3)])
    one = means[0][None] + rng.normal(size=(1, d))
    out = {
        "dense.features": f,
        "dense.labels": y,
        "dense.clients": clients,
        "dense.test": test,
        "dense.num_classes": np.array(c),
        "sparse.features": np.concatenate([f, one]),
        "sparse.labels": np.concatenate([y, [4]]),
        "sparse.clients": np.concatenate([clients, [1]]),
        "sparse.num_classes": np.array(6),
    }
    tensors = {}
    for k, v in out.items():
        t = torch.from_numpy(np.asarray(v))
        # floats: representable in float32
        t = t.float().double() if t.is_floating_point() else t.to(torch.int64)
        tensors[k] = t.contiguous()
    return tensors


def main() -> int:
    ghofl_repo, fedcgs_repo = sys.argv[1:3]
    torch.set_num_threads(1)
    inputs = make_inputs()
    save_file(inputs, HERE / "inputs.safetensors")
    inputs = load_file(HERE / "inputs.safetensors")
    meta = {"repository": "github.com/FabioTur-dev/One-Shot-FL", "commit": GHOFL_COMMIT}
    save_file(ghofl(ghofl_repo, inputs), HERE / "ghofl_reference.safetensors", meta)
    meta = {"repository": "github.com/Yuqin-G/FedCGS", "commit": FEDCGS_COMMIT}
    save_file(fedcgs(fedcgs_repo, inputs), HERE / "fedcgs_reference.safetensors", meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
