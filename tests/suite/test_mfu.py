"""The MFU step as variants in one call (issue #50): AdamW's default and
fused kernels, ``torch.compile``, a larger batch, each timed on the same
model from the same weights; its rows, one per variant. On a CPU the
compile variant runs with a stand-in for ``torch.compile`` (the real one
needs a compiler and tens of seconds): the code path is the variant's own."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from osfl.suite import mfu
from osfl.suite.catalogue import STEPS
from osfl.suite.rows import step_rows


def test_a_variant_is_flags_joined_with_plus() -> None:
    assert mfu.parse_variant("fused+compile+b256", 128) == mfu.Variant(
        "fused+compile+b256", fused=True, compile=True, batch=256
    )
    assert mfu.parse_variant("eager", 128) == mfu.Variant("eager", False, False, 128)
    for bad in ("turbo", "b0", "b8+b16", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="join eager, fused, compile"):
            mfu.parse_variant(bad, 128)
    step = next(s for s in STEPS if s.kind == "mfu")
    assert (
        step.argv[step.argv.index("--variants") + 1]
        == "eager,fused,fused+compile,fused+compile+b256"
    )


def test_the_variants_are_timed_in_one_call(tmp_path: Path) -> None:
    compiled: list[dict] = []

    def compile_fn(model, **kw):  # the stand-in: torch.compile's arguments, the eager module
        compiled.append(kw)
        return model

    args = mfu._parser().parse_args(
        ["--model", "vit_tiny_patch2_16", "--img-size", "8", "--batch", "2", "--steps", "1",
         "--warmup", "0", "--dtype", "float32", "--device", "cpu", "--out", str(tmp_path),
         "--variants", "eager,fused,fused+compile,fused+compile+b4"]
    )  # fmt: skip
    r = mfu.measure(args, compile_fn=compile_fn)
    names = [v["variant"] for v in r["variants"]]
    assert names == ["eager", "fused", "fused+compile", "fused+compile+b4"]
    assert compiled == [{"backend": "inductor", "dynamic": False}]  # compiled once, reused
    by = {v["variant"]: v for v in r["variants"]}
    assert [by[n]["fused_adamw"] for n in names] == [False, True, True, True]
    assert by["eager"]["compile_s"] is None and by["fused+compile"]["compile_s"] > 0
    # a ViT's FLOPs are linear in the batch
    assert by["fused+compile+b4"]["flops_per_step"] == 2 * by["eager"]["flops_per_step"]
    assert by["fused+compile+b4"]["batch"] == 4
    best = max(r["variants"], key=lambda v: v["achieved_tflops"])
    assert r["best_variant"] == best["variant"] and r["achieved_tflops"] == best["achieved_tflops"]
    assert r["mfu"] is None  # no peak on a CPU


def test_each_variant_is_a_row(tmp_path: Path) -> None:
    step = next(s for s in STEPS if s.kind == "mfu")
    record = {"model": "vit_base_patch16_224", "dtype": "bfloat16", "batch": 256, "mfu": 0.41,
              "achieved_tflops": 410.0, "provenance": {"gpu": "NVIDIA H200"},
              "variants": [{"variant": "eager", "batch": 128, "mfu": 0.26, "achieved_tflops": 258.0,
                            "images_per_s": 2437.0, "compile_s": None},
                           {"variant": "fused+compile+b256", "batch": 256, "mfu": 0.41,
                            "achieved_tflops": 410.0, "images_per_s": 3900.0, "compile_s": 48.0}]}  # fmt: skip
    (tmp_path / "mfu.json").write_text(json.dumps(record))
    rows = step_rows(step, tmp_path, ["suite", "mfu"], dry_run=False)
    assert [(r["method"], r["setting"], r["ours"]) for r in rows] == [
        ("MFU vit_base_patch16_224 bfloat16 (eager)", "batch 128", 26.0),
        ("MFU vit_base_patch16_224 bfloat16 (fused+compile+b256)", "batch 256", 41.0),
    ]
    assert rows[1]["compile_s"] == 48.0 and all(r["paper"] == 40.0 for r in rows)


@pytest.mark.slow
def test_the_compile_variant_compiles_for_real(tmp_path: Path) -> None:
    """torch.compile itself (dynamo's tracing, the ``eager`` backend: no C
    compiler needed) on the tiny ViT."""
    args = mfu._parser().parse_args(
        ["--model", "vit_tiny_patch2_16", "--img-size", "8", "--batch", "2", "--steps", "1",
         "--warmup", "0", "--dtype", "float32", "--device", "cpu", "--out", str(tmp_path),
         "--variants", "fused+compile", "--compile-backend", "eager"]
    )  # fmt: skip
    r = mfu.measure(args)
    assert r["variants"][0]["compiled"] and r["variants"][0]["compile_s"] > 0
