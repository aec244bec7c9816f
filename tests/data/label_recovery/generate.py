"""Regenerate the label-recovery reference fixtures from the authors' public code.

    python tests/data/label_recovery/generate.py \\
        --rlu PATH/Recovering-Label-from-Update \\
        --idlg PATH/Improved-Deep-Leakage-from-Gradients

Neither repository carries a licence, so none of their code is copied into
osfl: this script reads the named functions and loops from the clones with
``ast`` and executes them as they are, on small inputs made here, and stores
only the inputs and outputs (``rlu_code.json``, ``idlg.json``). The commits
the fixtures were made from, and what each value is, are in
``tests/data/README.md`` (``## label_recovery``). Needs numpy, scipy, torch
and osfl (for the LeNet-5 and the digits data of the iDLG cases).
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import scipy
import scipy.special

HERE = Path(__file__).resolve().parent


def _module(path: Path) -> tuple[str, ast.Module]:
    text = path.read_text()
    return text, ast.parse(text)


def functions(path: Path, *names: str) -> dict[str, Any]:
    """The top-level functions ``names`` of ``path``, executed into one namespace."""
    text, tree = _module(path)
    ns: dict[str, Any] = {"np": np, "scipy": scipy}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            exec(ast.get_source_segment(text, node), ns)  # the authors' function, as written
    missing = set(names) - set(ns)
    if missing:
        raise SystemExit(f"{path}: no function {sorted(missing)}")
    return ns


def _assigns_to(loop: ast.For, name: str) -> bool:
    """Whether a statement directly in the loop's body assigns ``name[...]``."""
    return any(
        isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == name
        for a in loop.body
        if isinstance(a, ast.Assign)
        for t in a.targets
    )


def loop(path: Path, scope: list[str], target: str) -> tuple[str, str]:
    """Source of the first ``for`` loop in ``scope`` (class/def names) whose body assigns
    ``target[...]``, and where it stands (``file:first-last line``)."""
    text, node = _module(path)
    for name in scope:
        node = next(
            n
            for n in node.body
            if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == name
        )
    for n in ast.walk(node):
        if isinstance(n, ast.For) and _assigns_to(n, target):
            src = textwrap.dedent(" " * n.col_offset + ast.get_source_segment(text, n))
            return src, f"{path.name}:{n.lineno}-{n.end_lineno}"
    raise SystemExit(f"{path}: no loop assigning {target}[...] in {'.'.join(scope)}")


def statements(path: Path, scope: str, names: list[str]) -> tuple[str, list[int]]:
    """Source of the first assignment to each of ``names`` inside function ``scope``, in
    order, and their line numbers."""
    text, tree = _module(path)
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == scope)
    out, lines = [], []
    for name in names:
        node = next(
            n
            for n in ast.walk(fn)
            if isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)
        )
        out.append(ast.get_source_segment(text, node))
        lines.append(node.lineno)
    return "\n".join(out), lines


def commit(repo: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


# ------------------------------------------------------------------ RLU (Chen & Vikalo)
def rlu_fixture(repo: Path) -> dict[str, Any]:
    utils = repo / "client" / "client_utils.py"
    ns = functions(utils, "learn_stat", "matrix", "estimated_entropy_from_grad")
    sgdm_loop, sgdm_at = loop(repo / "client" / "client_base.py", ["Client", "RLU"], "rho")
    prox_loop, prox_at = loop(repo / "client" / "client_prox.py", ["Client_prox", "RLU"], "rho")
    shift_loop, shift_at = loop(utils, ["estimate_static_RLU"], "shift")

    def run_loop(src: str, **env: Any) -> list[float]:
        scope = {"np": np, **env}
        exec(src, scope)  # the authors' loop, as written
        return scope["rho"].tolist()

    out: dict[str, Any] = {
        "repository": "CityChan/Recovering-Label-from-Update",
        "commit": commit(repo),
        "executed": {
            "rho_sgdm": f"client/{sgdm_at} (Client.RLU)",
            "rho_fedprox": f"client/{prox_at} (Client_prox.RLU)",
            "class_means": "client/client_utils.py: matrix, learn_stat",
            "shift": f"client/{shift_at} (estimate_static_RLU) on matrix()",
            "closed_form": "client/client_utils.py: estimated_entropy_from_grad",
        },
    }

    # rho(t) of FedAvg + SGD with momentum: the code's gamma is args.gamma (its LR decay)
    out["rho_sgdm"] = []
    for gamma, m in [(0.5, 1), (0.5, 4), (0.9, 5), (0.99, 10)]:
        args = SimpleNamespace(gamma=gamma, local_epochs=m)
        rho = run_loop(sgdm_loop, self=SimpleNamespace(args=args), gamma=gamma, rho=np.zeros(m))
        out["rho_sgdm"].append({"gamma": gamma, "local_epochs": m, "rho": rho})
    # rho(t) of FedProx + SGD
    out["rho_fedprox"] = []
    for mu, lr, m in [(0.5, 0.01, 5), (0.1, 0.05, 10), (1.0, 0.1, 3)]:
        args = SimpleNamespace(lr=lr, local_epochs=m)
        rho = run_loop(prox_loop, self=SimpleNamespace(args=args), mu=mu, rho=np.zeros(m))
        out["rho_fedprox"].append({"mu": mu, "lr": lr, "local_epochs": m, "rho": rho})

    # class-mean logits: matrix(args, predictions, ground_truths)[i][j] = mean logit i of class j
    rng = np.random.default_rng(0)
    k, b = 4, 5
    labels = [rng.permutation(np.arange(b) % k) for _ in range(3)]
    logits = [rng.normal(0, 1, (b, k)).round(6) for _ in range(3)]
    args = SimpleNamespace(n_classes=k, batch_size=b)
    extra_logits, extra_labels = np.zeros((b, k)), np.zeros(b, dtype=int)
    out["class_means"] = {
        "n_classes": k,
        "batch_size": b,
        "logits": [x.tolist() for x in logits],
        "labels": [y.tolist() for y in labels],
        "matrix": ns["matrix"](args, logits, labels).tolist(),
        "matrix_with_extra_batch": ns["matrix"](
            args, [*logits, extra_logits], [*labels, extra_labels]
        ).tolist(),
    }

    # shift[i]: off-diagonal mean of matrix() on softmax outputs (estimate_static_RLU), for
    # logits that are a point mass per class (every class-n sample has logits mu[n])
    k, b = 5, 5
    mu = rng.normal(0, 1.5, (k, k)).round(6)
    batches = [np.arange(k), np.roll(np.arange(k), 2), np.arange(k)]  # the last batch is unused
    preds = [scipy.special.softmax(mu[y], axis=1) for y in batches]
    args = SimpleNamespace(n_classes=k, batch_size=b)
    soft = ns["matrix"](args, preds, batches)
    shift = run_shift(shift_loop, args, soft)
    uniform = run_shift(shift_loop, args, ns["matrix"](args, [np.full((b, k), 1 / k)] * 3, batches))
    out["shift"] = {"n_classes": k, "class_logits": mu.tolist(), "shift": shift}

    # the code's per-class closed form vs Eq. 10: counts from the expected bias gradient
    # (mean loss over B samples) of a model whose class-n logits are mu[n]
    cases = []
    for name, logit_rows, sh in [("uniform", np.zeros((k, k)), uniform), ("point_mass", mu, shift)]:
        p = scipy.special.softmax(logit_rows, axis=1)
        for counts in ([3, 0, 5, 1, 1], [0, 0, 9, 0, 1], [2, 2, 2, 2, 2]):
            n = np.array(counts)
            bias = (n[:, None] * (p - np.eye(k))).sum(axis=0) / n.sum()
            got = ns["estimated_entropy_from_grad"](args, np.array(sh), bias.tolist(), int(n.sum()))
            cases.append(
                {
                    "model": name,
                    "class_logits": logit_rows.tolist(),
                    "counts": counts,
                    "bias_grad": bias.tolist(),
                    "shift": list(sh),
                    "code_counts": [int(v) for v in got],
                }
            )
    out["closed_form"] = cases
    return out


def run_shift(src: str, args: SimpleNamespace, soft: np.ndarray) -> list[float]:
    scope = {
        "np": np,
        "args": args,
        "mis_predictions_softmax": soft,
        "shift": np.zeros(args.n_classes),
    }
    exec(src, scope)  # the authors' loop, as written
    return scope["shift"].tolist()


# ------------------------------------------------------------------ iDLG (Zhao et al.)
#: (activation, model seed, index into the digits train set at 16 px, 3 channels)
IDLG_CASES = [("relu", 0, 0), ("relu", 0, 1), ("relu", 1, 2), ("tanh", 0, 3), ("tanh", 2, 4)]


def idlg_fixture(repo: Path) -> dict[str, Any]:
    import torch
    from torch import nn

    from osfl.data.sources import load_data
    from osfl.models import create_model

    src, lines = statements(
        repo / "iDLG.py", "main", ["out", "y", "dy_dx", "original_dy_dx", "label_pred"]
    )
    train = load_data("digits", image_size=16, channels=3).train
    cases = []
    for act, seed, idx in IDLG_CASES:
        torch.manual_seed(seed)
        net = create_model("lenet5", num_classes=10, img_size=16, act=act)
        scope: dict[str, Any] = {
            "torch": torch,
            "net": net,
            "criterion": nn.CrossEntropyLoss(),
            "gt_data": train.images[idx : idx + 1].float() / 255.0,
            "gt_label": train.labels[idx : idx + 1].long(),
        }
        exec(src, scope)  # the authors' lines, as written
        grads = scope["original_dy_dx"]
        cases.append(
            {
                "act": act,
                "model_seed": seed,
                "train_index": idx,
                "true_label": int(train.labels[idx]),
                "weight_grad_row_sums": grads[-2].sum(dim=-1).double().tolist(),
                "bias_grad": grads[-1].double().tolist(),
                "code_label": int(scope["label_pred"].item()),
            }
        )
    return {
        "repository": "PatrickZH/Improved-Deep-Leakage-from-Gradients",
        "commit": commit(repo),
        "executed": f"iDLG.py lines {lines} (main: the gradient, then the label)",
        "cases": cases,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rlu", type=Path, help="clone of CityChan/Recovering-Label-from-Update")
    p.add_argument(
        "--idlg", type=Path, help="clone of PatrickZH/Improved-Deep-Leakage-from-Gradients"
    )
    args = p.parse_args()
    if args.rlu:
        (HERE / "rlu_code.json").write_text(json.dumps(rlu_fixture(args.rlu), indent=1) + "\n")
    if args.idlg:
        (HERE / "idlg.json").write_text(json.dumps(idlg_fixture(args.idlg), indent=1) + "\n")


if __name__ == "__main__":
    main()
