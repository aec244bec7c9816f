"""The CPU fingerprint names what decides the kernels (issue "The README's
two commands pass on any clean machine"): capping oneDNN's ISA or ATen's
capability before torch loads changes it, and every record carries it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from unittest.mock import ANY

import pytest

from osfl.fl.fingerprint import (
    KERNEL_ENV,
    cpu_fingerprint,
    fingerprint_id,
    fingerprint_text,
    onednn_isa,
)
from osfl.fl.provenance import compute_environment
from support.paths import ROOT

_PRINT = (
    "import json; from osfl.fl.fingerprint import cpu_fingerprint; "
    "print(json.dumps(cpu_fingerprint()))"
)


def _fingerprint_with(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in KERNEL_ENV}
    out = subprocess.run(
        [sys.executable, "-c", _PRINT],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(onednn_isa() is None, reason="this torch has no oneDNN")
def test_capping_the_isa_changes_the_fingerprint() -> None:
    """SSE4.1 is below every x86-64 machine the README's set-up meets, so the
    capped run dispatches elsewhere than the machine's own on any of them."""
    native = _fingerprint_with()
    capped = _fingerprint_with(ONEDNN_MAX_CPU_ISA="SSE41", ATEN_CPU_CAPABILITY="default")
    assert native["onednn_isa"] != "sse41" and capped["onednn_isa"] == "sse41"
    assert capped["aten"] == "DEFAULT" and native["aten"] != "DEFAULT"
    assert capped["env"] == {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}
    assert fingerprint_id(native) != fingerprint_id(capped)
    assert native == cpu_fingerprint() or os.environ.keys() & set(KERNEL_ENV)


def test_the_id_covers_every_field_and_the_text_names_it() -> None:
    fp = cpu_fingerprint()
    assert fingerprint_id(fp) == fingerprint_id(dict(reversed(fp.items())))  # order-free
    for key in fp:
        changed = {**fp, key: "something else"}
        assert fingerprint_id(changed) != fingerprint_id(fp), key
    text = fingerprint_text(fp)
    assert text.endswith(f"fingerprint {fingerprint_id(fp)}")
    assert f"aten {fp['aten']}" in text and f"oneDNN {fp['onednn_isa']}" in text


def test_the_probe_leaves_standard_output_alone(capfd) -> None:
    """The oneDNN probe reads oneDNN's verbose line by redirecting file
    descriptor 1; what the process prints before and after still arrives."""
    print("before", flush=True)
    onednn_isa()
    print("after", flush=True)
    assert capfd.readouterr().out == "before\nafter\n"


def test_records_and_the_cache_key_carry_the_fingerprint() -> None:
    env = compute_environment("cpu")
    assert env["cpu_kernels"] == cpu_fingerprint()
    assert env["cpu_fingerprint"] == fingerprint_id(cpu_fingerprint())


_TINY_RUN = [
    "methods=[fedavg,ensemble]",
    "train.epochs=3",
    "data.max_per_class=40",
    "cache_dir=null",
    "--no-progress",
]


def _records_with(tmp_path, name: str, **env: str) -> tuple[list[tuple[str, float]], dict]:
    clean = {k: v for k, v in os.environ.items() if k not in KERNEL_ENV}
    out = tmp_path / name
    argv = [sys.executable, "-m", "osfl", "run", *_TINY_RUN, "--out", str(out)]
    subprocess.run(argv, env={**clean, **env}, capture_output=True, text=True, check=True)
    doc = json.loads((out / "metrics.json").read_text())
    return [(r["method"], r["global_test_accuracy"]) for r in doc["records"]], doc["machine"]


def test_portable_kernels_give_one_answer_across_isa_levels(tmp_path) -> None:
    """``OSFL_CPU_KERNELS=portable`` (MKL's COMPATIBLE branch, ATen's AVX2
    kernels, convolutions off oneDNN): capping oneDNN's ISA at SSE4.1 and
    MKL's instructions at SSE4.2 (what a CPU without AVX2 offers MKL) no
    longer moves a number (natively the oneDNN cap moves this run's Ensemble:
    15.96 against 16.19 on the machine the docs were recorded on; under
    portable's earlier AVX2 branch the MKL cap made MKL fall back to its AUTO
    branch, as it does on every non-Intel CPU), and the record says so."""
    native, machine = _records_with(tmp_path, "portable", OSFL_CPU_KERNELS="portable")
    capped, _ = _records_with(
        tmp_path,
        "capped",
        OSFL_CPU_KERNELS="portable",
        ONEDNN_MAX_CPU_ISA="SSE41",
        MKL_ENABLE_INSTRUCTIONS="SSE4_2",
    )
    assert native == capped
    kernels = machine["cpu_kernels"]
    assert kernels["onednn_conv"] is False and kernels["aten"] == "AVX2"
    assert kernels["env"]["MKL_CBWR"] == "COMPATIBLE"
    assert kernels["env"]["OSFL_CPU_KERNELS"] == "portable"


_PINS = "import os, osfl; print(os.environ.get('MKL_CBWR'), os.environ.get('ATEN_CPU_CAPABILITY'))"


@pytest.mark.parametrize(
    ("env", "pins"),
    [
        ({"OSFL_CPU_KERNELS": "portable"}, "COMPATIBLE avx2"),
        ({"OSFL_CPU_KERNELS": "portable", "MKL_CBWR": "AUTO"}, "AUTO avx2"),  # the user's kept
        ({}, "None None"),  # native: nothing pinned
    ],
)
def test_portable_pins_the_branch_mkl_gives_every_vendor(env: dict, pins: str) -> None:
    """MKL documents COMPATIBLE as the branch with the same results on Intel
    and AMD CPUs; its AVX2 branch (portable's before issue 55) is Intel-only
    and silently falls back to AUTO elsewhere. The pin is set when osfl is
    imported, before torch's first op reads it."""
    clean = {k: v for k, v in os.environ.items() if k not in KERNEL_ENV}
    out = subprocess.run(
        [sys.executable, "-c", _PINS], env={**clean, **env}, capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.strip() == pins


def test_an_unknown_kernel_choice_is_one_line(tmp_path) -> None:
    clean = {k: v for k, v in os.environ.items() if k not in KERNEL_ENV}
    argv = [sys.executable, "-m", "osfl", "run", *_TINY_RUN, "--out", str(tmp_path / "x")]
    proc = subprocess.run(
        argv, env={**clean, "OSFL_CPU_KERNELS": "portabel"}, capture_output=True, text=True
    )
    assert proc.returncode == 2 and "OSFL_CPU_KERNELS='portabel'" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "x").exists()


@pytest.mark.slow
def test_the_kernel_probe_reads_back_the_branch_mkl_took() -> None:
    """``benchmarks/kernel_probe.py`` (the digests REPRODUCTION.md compares
    across CPUs): under portable MKL runs its COMPATIBLE code path (0), the
    digests repeat, and capping MKL's instructions at SSE4.2 does not move
    them, where under AUTO it does."""
    clean = {k: v for k, v in os.environ.items() if k not in KERNEL_ENV}

    def probe(**env: str) -> dict:
        argv = [sys.executable, "benchmarks/kernel_probe.py"]
        out = subprocess.run(
            argv, env={**clean, **env}, cwd=ROOT, capture_output=True, text=True, check=True
        )
        return json.loads(out.stdout)

    portable = probe(OSFL_CPU_KERNELS="portable")
    if portable["mkl"] is None:
        pytest.skip("this torch build does not expose MKL's service symbols")
    assert portable["mkl"]["branch"] == "COMPATIBLE" and portable["mkl"]["code_path"] == 0
    assert probe(OSFL_CPU_KERNELS="portable", MKL_ENABLE_INSTRUCTIONS="SSE4_2") == {
        **portable,
        "mkl": {**portable["mkl"], "auto_branch": ANY},
        "kernels": {**portable["kernels"], "env": ANY},
    }
    auto = probe(OSFL_CPU_KERNELS="portable", MKL_CBWR="AUTO")
    capped = probe(OSFL_CPU_KERNELS="portable", MKL_CBWR="AUTO", MKL_ENABLE_INSTRUCTIONS="SSE4_2")
    assert auto["gemm_odd"] != capped["gemm_odd"]
