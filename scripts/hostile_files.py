"""Probe: hostile files and peers against every reader's command (issue 51).

Runs each case as its own ``osfl`` process (a hang is a timeout, not a stuck
probe) and sorts what happened:

- ``refused``: exit 2 with one ``osfl: error:`` line, or exit 1 with the
  line naming the difference (``osfl eval``: "... differs: ...");
- ``crash``: a traceback, a timeout (a hang) or any other exit status;
- ``accepted``: exit 0 where the file or peer is hostile;
- ``lost``: a finished record of a run directory gone after the command.

``python scripts/hostile_files.py [--work DIR] [--only SURFACE]`` prints one
line per case and the counts per surface; it exits 1 when a case crashed,
was accepted or lost a record. The surfaces: ``config`` (config files and
``base:`` chains, ``osfl config show``), ``split`` (``partition.from_file``,
``osfl run``), ``resume`` (``osfl run --resume``: the clients, the
trackers' ids), ``eval`` (kept models and the run's record, ``osfl eval``),
``events`` (``osfl flower status``), ``download`` (``osfl data get``
against a server on 127.0.0.1). About five minutes on two cores.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TINY = [
    "data.image_size=8",
    "partition.num_clients=2",
    "model.kwargs={width: 4}",
    "train.epochs=1",
    "train.batch_size=64",
    "threads_per_client=1",
    "--no-progress",
]


@dataclass
class Case:
    surface: str
    name: str
    argv: list[str]
    run_dir: Path | None = None  # its records must survive the command
    timeout_s: float = 120.0
    expect_ok: bool = False  # a case that must work (exit 0): the control


def osfl(argv: list[str], timeout_s: float = 300.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    return subprocess.run(
        [sys.executable, "-m", "osfl", *argv],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )


def _records(run: Path | None) -> list[tuple[str, int]] | None:
    if run is None:
        return None
    try:
        doc = json.loads((run / "metrics.json").read_text())
        return [(r["method"], r["seed"]) for r in doc["records"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def judge(case: Case) -> tuple[str, str]:
    """(outcome, the line that shows it)."""
    before = _records(case.run_dir)
    try:
        done = osfl(case.argv, case.timeout_s)
    except subprocess.TimeoutExpired:
        return "crash", f"no answer in {case.timeout_s:g} s (a hang)"
    after = _records(case.run_dir)
    if before is not None and (after is None or not set(before) <= set(after)):
        return "lost", f"records {before} -> {after}"
    err = done.stderr.strip()
    if "Traceback" in err:
        return "crash", err.splitlines()[-1][:200]
    errors = [line for line in err.splitlines() if line.startswith("osfl: error:")]
    if done.returncode == 2 and len(errors) == 1:
        return "refused", errors[0][:200]
    differs = [line for line in done.stdout.splitlines() if " differs: " in line]
    if done.returncode == 1 and differs:
        return "refused", differs[0][:200]
    if done.returncode == 0:
        return "accepted", (done.stdout.strip().splitlines() or [""])[-1][:200]
    return "crash", f"exit {done.returncode}: {err[-200:]}"


# --------------------------------------------------------------------------- hostile files
def _not_utf8(p: Path, json_: bool) -> None:
    p.write_bytes(b'{"a": "\xff\xfe"}' if json_ else b"train: {lr: \xff}\n")


def _deep(p: Path, json_: bool) -> None:
    p.write_text(("[" * 5000 + "]" * 5000) if json_ else "a: " + "[" * 5000 + "]" * 5000)


def _large(p: Path, json_: bool) -> None:
    p.write_bytes(b"")
    os.truncate(p, 20 << 30)  # sparse: larger than any reader's bound


KINDS: dict[str, Callable[[Path, bool], None]] = {
    "not-utf8": _not_utf8,
    "deep": _deep,
    "large": _large,
    "fifo": lambda p, j: os.mkfifo(p),
    "dev-zero": lambda p, j: os.symlink("/dev/zero", p),
    "directory": lambda p, j: p.mkdir(),
    "wrong-type": lambda p, j: p.write_text("[1, 2, 3]\n"),
    "garbage": lambda p, j: p.write_bytes(os.urandom(256)),
    "empty": lambda p, j: p.write_bytes(b""),
}


def replace(path: Path, kind: str, json_: bool) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    KINDS[kind](path, json_)


def copy(run: Path, where: Path) -> Path:
    shutil.rmtree(where, ignore_errors=True)
    return Path(shutil.copytree(run, where, symlinks=True))


# --------------------------------------------------------------------------- surfaces
def config_cases(w: Path) -> Iterator[Case]:
    for kind in KINDS:
        f = w / f"cfg-{kind}.yaml"
        KINDS[kind](f, False)
        # an empty YAML file is an empty mapping: a config that sets nothing (a control)
        empty = kind == "empty"
        yield Case("config", f"config file: {kind}", ["config", "show", str(f)], expect_ok=empty)
        d = w / f"base-{kind}"
        d.mkdir()
        KINDS[kind](d / "b.yaml", False)
        (d / "child.yaml").write_text("base: b.yaml\n")
        argv = ["config", "show", str(d / "child.yaml")]
        yield Case("config", f"base file: {kind}", argv, expect_ok=empty)
    for depth in (12, 16, 20):
        d = w / f"diamond{depth}"
        d.mkdir()
        for i in range(depth):
            (d / f"l{i}.yaml").write_text(f"base: [l{i + 1}.yaml, l{i + 1}.yaml]\n")
        (d / f"l{depth}.yaml").write_text("base: none\ntrain: {epochs: 2}\n")
        argv = ["config", "show", str(d / "l0.yaml")]
        yield Case("config", f"diamond of {depth} levels", argv, expect_ok=True)
    passwd = w / "passwd.yaml"
    passwd.write_text("base: /etc/passwd\n")
    yield Case("config", "base: /etc/passwd", ["config", "show", str(passwd)])
    cyc = w / "cyc"
    cyc.mkdir()
    (cyc / "a.yaml").write_text("base: b.yaml\n")
    (cyc / "b.yaml").write_text("base: a.yaml\n")
    yield Case("config", "base cycle", ["config", "show", str(cyc / "a.yaml")])
    yield Case("config", "config /dev/zero", ["config", "show", "/dev/zero"])
    yield Case("config", "deep override", ["config", "show", "train.lr=" + "[" * 3000 + "]" * 3000])


def split_cases(w: Path, split: Path, train_labels: list[int]) -> Iterator[Case]:
    def run_on(path: Path, *extra: str) -> list[str]:
        return ["run", *TINY, "methods=[fedavg]", f"partition.from_file={path}", *extra]

    for kind in KINDS:
        f = w / f"split-{kind}.json"
        KINDS[kind](f, True)
        yield Case("split", f"split file: {kind}", [*run_on(f), "--out", str(w / f"o-{kind}")])
    doc = json.loads(split.read_text())
    a, b = doc["client_indices"][0], doc["client_indices"][1]
    i = next(x for x in a if any(train_labels[y] != train_labels[x] for y in b))
    j = next(y for y in b if train_labels[y] != train_labels[i])
    a[a.index(i)], b[b.index(j)] = j, i
    a.sort()
    b.sort()
    swapped = w / "swapped.json"
    swapped.write_text(json.dumps(doc))
    yield Case("split", "an index exchanged", [*run_on(swapped), "--out", str(w / "o-swap")])
    doc = json.loads(split.read_text())
    doc["class_counts"] = [row[::-1] for row in doc["class_counts"]]
    rev = w / "reversed.json"
    rev.write_text(json.dumps(doc))
    yield Case("split", "reversed class_counts", [*run_on(rev), "--out", str(w / "o-rev")])
    doc = json.loads(split.read_text())
    doc["version"] = 1
    old = w / "v1.json"
    old.write_text(json.dumps(doc))
    yield Case("split", "format 1 file", [*run_on(old), "--out", str(w / "o-v1")])
    for opt in ("partition.scheme=pathological", "partition.alpha=0.3", "partition.seed=5"):
        argv = [*run_on(split, opt), "--out", str(w / f"o-{opt}")]
        yield Case("split", f"{opt} beside the file", argv)


def resume_cases(w: Path, base_run: Path, split_run: Path, split: Path) -> Iterator[Case]:
    for kind in KINDS:
        d = copy(base_run, w / f"tr-{kind}")
        replace(d / "trackers.json", kind, True)
        yield Case("resume", f"trackers.json: {kind}", ["run", "--resume", str(d)], run_dir=d)
    for kind in ("not-utf8", "deep", "fifo", "dev-zero", "directory", "wrong-type"):
        d = copy(base_run, w / f"cfg-{kind}")
        replace(d / "config.yaml", kind, False)
        yield Case("resume", f"config.yaml: {kind}", ["run", "--resume", str(d)], run_dir=None)
    d = copy(split_run, w / "resplit")
    doc = json.loads((d / "metrics.json").read_text())
    doc["records"] = doc["records"][:1]
    (d / "metrics.json").write_text(json.dumps(doc))
    other = w / "other-split.json"
    osfl(
        [
            "partition",
            "--dataset",
            "digits",
            "--scheme",
            "iid",
            "--clients",
            "2",
            "--seed",
            "9",
            "--out",
            str(other),
        ]
    )
    shutil.copy(split, w / "kept-split.json")
    shutil.copy(other, split)
    yield Case("resume", "from_file replaced by another split", ["run", "--resume", str(d)], d)
    for where in (w / "nowhere", w, base_run / "metrics.json"):
        yield Case("resume", f"--resume {where.name}", ["run", "--resume", str(where)])


def eval_cases(w: Path, run: Path) -> Iterator[Case]:
    m = "models/fedavg-seed0"
    for name in ("card.json", "state.safetensors", "model.safetensors", "../../metrics.json"):
        for kind in KINDS:
            d = copy(run, w / f"ev-{Path(name).name}-{kind}")
            replace(d / m / name, kind, name.endswith(".json"))
            yield Case("eval", f"{Path(name).name}: {kind}", ["eval", str(d)], run_dir=None)
    d = copy(run, w / "ev-trunc")
    blob = (d / m / "model.safetensors").read_bytes()
    (d / m / "model.safetensors").write_bytes(blob[: len(blob) // 2])
    yield Case("eval", "model.safetensors truncated", ["eval", str(d)])
    d = copy(run, w / "ev-reseal")
    from safetensors.torch import load_file, save  # heavy: torch

    weights = load_file(d / m / "model.safetensors")
    big = max(weights, key=lambda k: weights[k].numel())
    weights[big] = weights[big] * 0
    blob = save(weights)
    (d / m / "model.safetensors").write_bytes(blob)
    card = json.loads((d / m / "card.json").read_text())
    card["files"]["model.safetensors"] = hashlib.sha256(blob).hexdigest()
    card["sizes"]["model.safetensors"] = len(blob)
    (d / m / "card.json").write_text(json.dumps(card))
    yield Case("eval", "model.safetensors resealed", ["eval", str(d)])
    d = copy(run, w / "ev-metrics")
    doc = json.loads((d / "metrics.json").read_text())
    doc["records"][0]["global_test_accuracy"] = 0.5366
    (d / "metrics.json").write_text(json.dumps(doc))
    yield Case("eval", "metrics.json accuracy differs", ["eval", str(d)])
    d = copy(run, w / "ev-card")
    card = json.loads((d / m / "card.json").read_text())
    (d / m / "card.json").write_text(json.dumps({**card, "accuracy": 0.9}))
    yield Case("eval", "card accuracy differs", ["eval", str(d)])
    for label, sweep in (
        ("data.source", {"data.source": "imagefolder:/etc"}),
        ("unknown point", {"train.lr": "9"}),
    ):
        d = copy(run, w / f"ev-sweep-{label}")
        (d / m / "card.json").write_text(json.dumps({**card, "sweep": sweep}))
        yield Case("eval", f"card sweep: {label}", ["eval", str(d)])
    d = copy(run, w / "ev-msym")
    shutil.rmtree(d / "models")
    os.symlink(run / "models", d / "models")
    yield Case("eval", "models/ linked to another run", ["eval", str(d)])
    d = copy(run, w / "ev-fsym")
    shutil.rmtree(d / m)
    os.symlink(run / m, d / m)
    yield Case("eval", "model folder linked to another run", ["eval", str(d)])
    d = copy(run, w / "ev-dup")
    shutil.copytree(d / m, d / "models" / "fedavg-seed0-x")
    yield Case("eval", "two folders claim one model", ["eval", str(d)])
    yield Case("eval", "--all without --data", ["eval", str(run), "--all"])


def names_case(w: Path, run: Path) -> Iterator[Case]:
    from PIL import Image  # heavy: only this case draws images

    root = w / "letters"
    for c in range(10):
        (root / "test" / chr(97 + c)).mkdir(parents=True)
        for i in range(3):
            Image.new("L", (8, 8), color=i * 40 + c).save(root / "test" / chr(97 + c) / f"{i}.png")
    yield Case(
        "eval", "--data with other class names", ["eval", str(run), "--data", f"imagefolder:{root}"]
    )


def event_cases(w: Path, run: Path) -> Iterator[Case]:
    for kind in KINDS:
        d = copy(run, w / f"evl-{kind}")
        replace(d / "events.jsonl", kind, True)
        yield Case("events", f"events.jsonl: {kind}", ["flower", "status", str(d)])


class Hostile(SimpleHTTPRequestHandler):
    """Answers by the probe's current ``mode``."""

    mode = "ok"
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        mode = type(self).mode
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            if mode in ("ftp", "file", "loop"):
                to = {"ftp": "ftp://127.0.0.1/x", "file": "file:///etc/passwd"}.get(mode, self.path)
                self.send_response(302)
                self.send_header("Location", to)
                self.end_headers()
                return
            self.send_response(200)
            if mode == "huge":
                self.send_header("Content-Length", str(1 << 40))
            self.end_headers()
            if mode == "trickle":
                for _ in range(600):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.2)
            elif mode == "endless":
                for _ in range(1 << 15):
                    self.wfile.write(b"y" * 65536)


def download_cases(w: Path, url: str) -> Iterator[tuple[str, Case]]:
    args = ["data", "get", "mnist", "--mirror", url, "--timeout", "3", "--max-bytes", "1M"]
    for mode in ("trickle", "endless", "huge", "ftp", "file", "loop"):
        cache = ["--cache", str(w / f"dl-{mode}")]
        yield mode, Case("download", f"server: {mode}", [*args, *cache], timeout_s=60)


@contextlib.contextmanager
def server(www: Path) -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Hostile, directory=str(www)))
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


# --------------------------------------------------------------------------- main
def prepare(w: Path) -> tuple[Path, Path, Path, list[int]]:
    """A finished run (fedavg, with TensorBoard), a saved split and a run on it."""
    base = w / "base-run"
    done = osfl(["run", *TINY, "methods=[fedavg]", "logger=[tensorboard]", "--out", str(base)])
    assert done.returncode == 0, done.stderr[-2000:]
    split = w / "p.json"
    argv = ["partition", "--dataset", "digits", "--scheme", "iid", "--clients", "2"]
    assert osfl([*argv, "--seed", "0", "--out", str(split)]).returncode == 0
    split_run = w / "split-run"
    done = osfl(
        [
            "run",
            *TINY,
            "methods=[fedavg,ensemble]",
            f"partition.from_file={split}",
            "--out",
            str(split_run),
        ]
    )
    assert done.returncode == 0, done.stderr[-2000:]
    from osfl import assembly  # heavy: torch
    from osfl.config import load_config

    labels = assembly.load_splits(load_config(None, ["data.image_size=8"])).train.labels.tolist()
    return base, split_run, split, labels


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--work", type=Path, default=None, help="a scratch folder (default: a temp one)"
    )
    ap.add_argument("--only", help="one surface: config, split, resume, eval, events, download")
    args = ap.parse_args()
    w = args.work or Path(tempfile.mkdtemp(prefix="osfl-hostile-"))
    w.mkdir(parents=True, exist_ok=True)
    base, split_run, split, labels = prepare(w)
    surfaces: dict[str, Callable[[], Iterator[Case]]] = {
        "config": lambda: config_cases(w / "config"),
        "split": lambda: split_cases(w / "split", split, labels),
        "resume": lambda: resume_cases(w / "resume", base, split_run, split),
        "eval": lambda: (
            c for g in (eval_cases(w / "eval", base), names_case(w / "eval", base)) for c in g
        ),
        "events": lambda: event_cases(w / "events", base),
    }
    counts: dict[str, Counter[str]] = {}
    for surface, cases in surfaces.items():
        if args.only and args.only != surface:
            continue
        (w / surface).mkdir(exist_ok=True)
        for case in cases():
            report(case, *judge(case), counts)
    if not args.only or args.only == "download":
        (w / "www").mkdir(exist_ok=True)
        with server(w / "www") as url:
            for mode, case in download_cases(w, url):
                Hostile.mode = mode
                report(case, *judge(case), counts)
    print("\nsurface   tried  refused  crash  accepted  lost  (controls ok)")
    total: Counter[str] = Counter()
    for surface, c in [*counts.items(), ("all", total)]:
        if surface != "all":
            total.update(c)
        tried = sum(c.values()) - c["ok"]
        print(
            f"{surface:9s} {tried:5d} {c['refused']:8d} {c['crash']:6d} "
            f"{c['accepted']:9d} {c['lost']:5d}  ({c['ok']})"
        )
    return 1 if total["crash"] or total["lost"] or total["accepted"] else 0


def report(case: Case, outcome: str, line: str, counts: dict[str, Counter[str]]) -> None:
    if case.expect_ok:  # a control that must work: accepted is right, anything else a crash
        outcome = "ok" if outcome == "accepted" else "crash"
    counts.setdefault(case.surface, Counter())[outcome] += 1
    print(f"[{case.surface}] {case.name}: {outcome}: {line}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
