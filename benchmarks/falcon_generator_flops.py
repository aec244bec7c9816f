"""GFLOPs per synthetic token sequence of FALCON's M-AR generator at the
paper's configuration, osfl's and (given its checkout) the authors'.

Liu et al., "Feature-Aware One-Shot Federated Learning via Hierarchical Token
Sequences" (FALCON), §3.1 and Fig. 5 (0.46 GFLOPs per sequence); the authors'
generator is ``models/mar_generator.py::MDNGenerator.generate_full_proxy`` of
github.com/LMIAPC/FALCON (read at b3efbab; config.py ``stage2``: 20 mixtures,
depth 4, feed-forward 768, 16 heads; one-hot class condition). Both are counted
by the same counter (``torch.utils.flop_counter.FlopCounterMode``: matrix
products only) over one batch of draws, per sequence:

    python benchmarks/falcon_generator_flops.py                      # osfl's
    python benchmarks/falcon_generator_flops.py --authors PATH/FALCON  # and theirs
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from osfl.methods.falcon.generator import GeneratorConfig, SequenceGenerator

#: The paper's scale: DINOv2-B tokens (D = 768), 1 global + 2x2 local views, K = 20.
D, GRID, K, CLASSES = 768, 2, 20, 10


def per_sequence(draw, batch: int) -> float:
    with FlopCounterMode(display=False) as counter:
        draw()
    return counter.get_total_flops() / batch / 1e9


def ours(batch: int) -> float:
    cfg = GeneratorConfig(depth=4, width=None, heads=16, components=K, mlp_ratio=1.0)
    g = SequenceGenerator(D, 1 + GRID * GRID, CLASSES, cfg, variant="mar").eval()
    y = torch.arange(batch) % CLASSES
    return per_sequence(lambda: g.sample(y, torch.Generator().manual_seed(0)), batch)


def theirs(repo: Path, batch: int) -> float:
    spec = importlib.util.spec_from_file_location(
        "mar_generator", repo / "models" / "mar_generator.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    g = module.MDNGenerator(
        cond_dim=CLASSES, feature_dim=D, num_mixtures=K, depth=4, hidden_dim=768, num_heads=16
    ).eval()
    cond = F.one_hot(torch.arange(batch) % CLASSES, CLASSES).float()
    return per_sequence(lambda: g.generate_full_proxy(cond, GRID), batch)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--authors", type=Path, help="a checkout of github.com/LMIAPC/FALCON")
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()
    mine = ours(args.batch)
    print(f"osfl M-AR generator: {mine:.4f} GFLOPs per sequence")
    if args.authors is not None:
        ref = theirs(args.authors, args.batch)
        print(f"authors' MDNGenerator.generate_full_proxy: {ref:.4f} GFLOPs per sequence")
        print(f"osfl / authors: {mine / ref:.3f}")


if __name__ == "__main__":
    main()
