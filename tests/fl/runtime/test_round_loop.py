"""The round loop's server side, by value (``osfl.fl.runtime.rounds``): what
the inbox records of each client's turn, what the screen is asked, the
uploads kept from before a restart, the checkpoint a run resumes from, and
the weighted mean of a summing transport (the mutants the end-to-end runtime
tests did not see; TESTING.md, "Mutation testing").

A scripted transport stands in for the clients: each test says what every
client sends.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
import torch

from osfl import assembly
from osfl.config import load_config
from osfl.errors import ConfigError, UploadError
from osfl.fl.context import ClientState
from osfl.fl.observers import Observer, Observers
from osfl.fl.runtime import rounds as rounds_module
from osfl.fl.runtime.base import RoundRecord
from osfl.fl.runtime.checkpoint import PendingUpload, RoundCheckpoints
from osfl.fl.runtime.client import ClientTurn
from osfl.fl.runtime.identity import job_digest
from osfl.fl.runtime.rounds import ClientTransport, Inbox, RoundLoop, RoundUploads
from osfl.fl.seeds import derive_seed
from osfl.fl.upload import Broadcast, Upload
from support.progress import RecordingBoard
from support.tiny import TINY


@pytest.fixture(scope="module")
def job() -> Any:
    cfg = load_config(
        None, [*TINY, "partition.num_clients=4", "methods=[fedavg]", "cache_dir=null"]
    )
    ctx = assembly.seed_context(cfg, assembly.load_splits(cfg), 0)
    return assembly.build_job(cfg, "fedavg", ctx)


def _raw(job: Any, client: int) -> bytes:
    state = job.method.init_state()
    return Upload(dict(state), {"num_samples": job.clients.size(client)}).to_bytes()


class _Scripted(ClientTransport):
    """Clients whose turns are given; records what the loop asks of it."""

    def __init__(self, turns: Mapping[int, ClientTurn]):
        self.turns, self.asked, self.restored = dict(turns), [], []

    def exchange(self, round, clients, payload, task):
        self.asked.append((round, list(clients)))
        return {c: self.turns[c] for c in clients}

    def client_states(self):
        return {}

    def restore(self, states):
        self.restored.append(dict(states))

    def evaluate(self, payload, clients):
        raise NotImplementedError

    def score_client_models(self, payload, clients):
        raise NotImplementedError


def test_the_inbox_records_each_turn_in_turn_order_and_goes_on_after_a_refusal(job, caplog) -> None:
    inbox = Inbox(job, Observers([]), checkpoints=None)
    good = _raw(job, 3)
    turns = {
        2: ClientTurn(upload=None, state=None, failure="timed out"),
        0: ClientTurn(upload=None, state=None),
        1: ClientTurn(upload=b"not an upload", state=None, warnings=("loss rose",)),
        5: ClientTurn(upload=b"also not", state=None),
        3: ClientTurn(upload=good, state=None),
    }
    with caplog.at_level(logging.WARNING, "osfl.fl.runtime.rounds"):
        got = inbox.receive(job.method.init_state(), 4, turns)
    assert got.accepted == [3] and list(got.uploads) == [3]
    assert got.refused[2] == "timed out" and got.refused[0] == "no upload"
    assert got.refused[1].startswith("[client 1, field '*'] ")
    assert got.refused[5].startswith("[client 5, field '*'] ")
    assert got.bytes_refused == len(b"not an upload") + len(b"also not")
    assert got.bytes_up == {3: len(good)} and got.warnings == {1: ["loss rose"]}
    said = [r.getMessage() for r in caplog.records]
    assert said[:2] == [
        "round 4: client 2 sent nothing: timed out",
        "round 4: client 0 sent nothing: no upload",
    ]
    assert said[2] == f"round 4: upload refused: {got.refused[1]}"


def test_the_screen_is_asked_about_this_state_round_and_client(job, monkeypatch) -> None:
    asked: list[tuple[Any, int, int]] = []

    def screen(state, r, c, upload):
        asked.append((state, r, c))
        return "its features are not finite" if c == 2 else None

    monkeypatch.setattr(job.method, "screen", screen)
    inbox = Inbox(job, Observers([]), checkpoints=None)
    state = job.method.init_state()
    turns = {1: ClientTurn(_raw(job, 1), None), 2: ClientTurn(_raw(job, 2), None)}
    got = inbox.receive(state, 3, turns)
    assert [(s is state, r, c) for s, r, c in asked] == [(True, 3, 1), (True, 3, 2)]
    assert got.accepted == [1]
    assert got.refused == {2: "[client 2, field '*'] its features are not finite"}


def test_the_spec_is_the_methods_for_this_round_and_client(job, monkeypatch) -> None:
    asked: list[tuple[int, int]] = []
    spec_of = job.method.upload_spec

    def recording(state, r, c):
        asked.append((r, c))
        return spec_of(state, r, c)

    monkeypatch.setattr(job.method, "upload_spec", recording)
    inbox = Inbox(job, Observers([]), checkpoints=None)
    inbox.accept(job.method.init_state(), 2, 3, _raw(job, 3))
    assert asked == [(2, 3)]


def test_uploads_kept_before_a_restart_are_not_asked_for_again(job, tmp_path, caplog) -> None:
    """Client 1's upload of round 2 was accepted before the server stopped:
    the transport asks only the others, gives client 1 back its state, and
    client 1's turn is the kept upload with its warnings."""
    checkpoints = RoundCheckpoints(tmp_path)
    kept = PendingUpload(_raw(job, 1), b"client-1-state", ("loss rose",))
    checkpoints.keep(2, 1, kept)
    checkpoints.keep(1, 0, PendingUpload(_raw(job, 0), None, ()))  # another round's
    board = RecordingBoard()
    job = dataclasses.replace(job, run=dataclasses.replace(job.run, progress=board))
    inbox = Inbox(job, Observers([]), checkpoints)
    assert inbox.kept(2, [0, 3]) == {} and set(inbox.kept(2, [0, 1, 3])) == {1}
    transport = _Scripted({0: ClientTurn(_raw(job, 0), None), 3: ClientTurn(_raw(job, 3), None)})
    with caplog.at_level(logging.INFO, "osfl.fl.runtime.rounds"):
        got = transport.collect(inbox, job.method.init_state(), 2, [0, 1, 3], b"12345")
    assert transport.asked == [(2, [0, 3])] and transport.restored == [{1: b"client-1-state"}]
    assert got.accepted == [0, 1, 3] and got.warnings == {1: ["loss rose"]}
    assert got.bytes_up[1] == len(kept.upload) and got.bytes_down == {0: 5, 1: 5, 3: 5}
    assert "round 2: 1 upload(s) kept from before the restart" in [
        r.getMessage() for r in caplog.records
    ]
    assert set(inbox.kept(2, [0, 1, 3])) == {0, 1, 3}  # every accepted upload is kept
    assert inbox.kept(2, [1])[1].state == b"client-1-state"  # and keeps its state
    assert [(b.name, b.total) for b in board.bars] == [("fedavg: round 3/1, clients", 2)]


def test_a_run_resumes_from_its_checkpoint_as_it_was_saved(job, tmp_path, monkeypatch) -> None:
    """What ``save`` writes after a round, ``restart`` gives back: the state,
    the next round, the records (client ids as ints), the bytes per round
    and client, the times and the clients' states."""
    saving = RoundLoop(job, _Scripted({}))
    saving.checkpoints = RoundCheckpoints(tmp_path)
    state = job.method.init_state()
    record = RoundRecord(
        round=0,
        clients=[0, 2],
        accepted=[2],
        refused={0: "no upload"},
        bytes_up=7,
        bytes_down=9,
        bytes_refused=3,
        time_client_s=0.5,
        time_server_s=0.25,
        warnings={2: ["loss rose"]},
    )
    saving.bytes.up[0][2] += 7
    saving.bytes.down[0][0] += 4
    saving.times["client"] = 1.5
    kept = ClientState(tensors={"c": torch.ones(2)}, meta={"n": 1})
    saving.transport.client_states = lambda: {1: kept}
    saving.save(state, 1, [record])

    resumed = RoundLoop(job, _Scripted({}))
    resumed.checkpoints = RoundCheckpoints(tmp_path)
    resumed.digest = saving.digest
    replayed: list[Any] = []
    sample = type(job.method).sample_clients
    monkeypatch.setattr(
        job.method,
        "sample_clients",
        lambda r, n, rng: replayed.append(r) or sample(job.method, r, n, rng),
    )
    got_state, start, records = resumed.restart()
    assert replayed == [0]  # the finished round's draw, replayed with its round (FENS reads it)
    assert start == 1 and records == [record]
    assert records[0].refused == {0: "no upload"} and records[0].warnings == {2: ["loss rose"]}
    assert all(torch.equal(got_state[k], v) for k, v in state.items())
    assert dict(resumed.bytes.up[0]) == {2: 7} and dict(resumed.bytes.down[0]) == {0: 4}
    assert resumed.times["client"] == 1.5 and resumed.transport.restored == [{1: kept.to_bytes()}]


def test_a_summed_round_goes_to_the_methods_secure_aggregation(job, monkeypatch) -> None:
    loop = RoundLoop(job, _Scripted({}))
    mean = Upload({"w": torch.ones(1)}, {"num_samples": 3})
    seen: list[tuple[Any, Any, int]] = []
    monkeypatch.setattr(
        job.method, "aggregate_mean", lambda state, m, r: seen.append((state, m, r)) or "new"
    )
    state = {"s": 1}
    summed = RoundUploads(accepted=[0, 1], refused={}, mean=mean)
    assert loop.aggregate(state, summed, 6) == "new" and seen == [(state, mean, 6)]


def test_a_method_without_secure_aggregation_cannot_take_a_summed_round(job) -> None:
    class _Plain:
        name = "plain"

    loop = RoundLoop(job, _Scripted({}))
    loop.method = _Plain()
    with pytest.raises(ConfigError, match=r"^plain cannot aggregate a weighted mean of uploads$"):
        loop.aggregate({}, RoundUploads(accepted=[0], refused={}, mean=Upload({}, {})), 0)


# --------------------------------------------------------------------------- the loop
def test_a_new_loop_starts_from_nothing_with_its_seeded_sampling(job, tmp_path) -> None:
    loop = RoundLoop(job, _Scripted({}))
    assert loop.times == {"client": 0.0, "server": 0.0, "eval": 0.0} and loop.checkpoints is None
    want = np.random.default_rng(derive_seed(job.seed, "client-sampling"))
    assert loop.rng.bit_generator.state == want.bit_generator.state
    saving = RoundLoop(dataclasses.replace(job, state_dir=tmp_path), _Scripted({}))
    assert saving.checkpoints.root == tmp_path and saving.inbox.checkpoints is saving.checkpoints
    assert loop.digest == job_digest(job)
    tagged = _Scripted({})
    tagged.checkpoint_tag = "secagg"
    assert RoundLoop(job, tagged).digest == job_digest(job) + "+secagg"


def test_too_few_usable_uploads_stop_the_run_saying_whose_and_why(job) -> None:
    run = dataclasses.replace(job.run, server=dataclasses.replace(job.run.server, min_clients=2))
    loop = RoundLoop(dataclasses.replace(job, run=run), _Scripted({}))
    loop.require_enough(RoundUploads(accepted=[0, 3], refused={1: "no upload"}), 3, 4)
    why = {1: "[client 1, field 'meta'] bad", 2: "no upload"}
    with pytest.raises(UploadError) as e:
        loop.require_enough(RoundUploads(accepted=[], refused=why), 3, 4)
    assert str(e.value) == (
        "round 3: every upload was refused ([client 1, field 'meta'] bad; client 2: no upload)"
    )
    with pytest.raises(UploadError) as e:
        loop.require_enough(RoundUploads(accepted=[], refused={}), 3, 4)
    assert str(e.value) == "round 3: every upload was refused (none were sent)"
    with pytest.raises(UploadError) as e:
        loop.require_enough(RoundUploads(accepted=[0], refused={}), 3, 4)
    assert str(e.value) == (
        "round 3: 1 usable upload(s) of 4 client(s), fewer than server.min_clients=2 "
        "(none were sent)"
    )


class _Watch(Observer):
    """Records what the loop tells its observers."""

    def __init__(self):
        self.seen: list[tuple[Any, ...]] = []

    def on_run_start(self, method_name, run):
        self.seen.append(("start", method_name, run))

    def on_broadcast(self, round, client, broadcast, nbytes):
        self.seen.append(("broadcast", round, client))

    def on_round_end(self, round, state, metrics):
        self.seen.append(("end", round, state, dict(metrics)))

    def on_run_end(self, result):
        self.seen.append(("run", result))


class _Echo(_Scripted):
    """Every client sends the state it was sent; round ``stop`` fails."""

    def __init__(self, job: Any, stop: int | None = None):
        super().__init__({})
        self.job, self.stop = job, stop

    def exchange(self, round, clients, payload, task):
        self.asked.append((round, list(clients)))
        if round == self.stop:
            raise RuntimeError("the server stopped")
        sent = Broadcast.from_bytes(payload).tensors
        return {
            c: ClientTurn(
                Upload(dict(sent), {"num_samples": self.job.clients.size(c)}).to_bytes(), None
            )
            for c in clients
        }


def _rounds(job: Any, n: int, options: dict[str, Any] | None = None, **more: Any) -> Any:
    """``job`` with its method's ``rounds`` (and other ``options``) set."""
    config = dataclasses.replace(job.method.config, rounds=n, **(options or {}))
    return dataclasses.replace(job, method=type(job.method)(config, job.run), **more)


def test_each_round_reaches_the_observers_the_record_and_the_checkpoint(job, tmp_path) -> None:
    """Three rounds, scored every round: each round's broadcast goes to its
    clients, its end (with its metrics, the last one's final) to the
    observers, and a run stopped in round 2 resumes there, asking only
    round 2's clients, with the same final state."""
    scored = _rounds(job, 3, eval_every=1, state_dir=tmp_path / "a")
    watch = _Watch()
    result = RoundLoop(scored, _Echo(scored), [watch]).execute()
    ends = [s for s in watch.seen if s[0] == "end"]
    assert [e[1] for e in ends] == [0, 1, 2] and ends[-1][2] is result.state
    assert all("global_test_accuracy" in e[3]["metrics"] for e in ends)
    assert [r.round for r in result.rounds] == [0, 1, 2] and result.metrics == ends[-1][3][
        "metrics"
    ]
    assert watch.seen[0][:2] == ("start", "fedavg") and watch.seen[-1] == ("run", result)
    assert [s[1] for s in watch.seen if s[0] == "broadcast"] == [0] * 4 + [1] * 4 + [2] * 4
    times = result.time_s
    assert times["client"] == sum(r.time_client_s for r in result.rounds)
    assert times["total"] == times["client"] + times["server"] + times["eval"]
    assert all(r.time_server_s >= 0 and r.time_client_s >= 0 for r in result.rounds)
    assert result.predictor is not None and result.client_states == {}

    stopped = _rounds(job, 3, eval_every=1, state_dir=tmp_path / "b")
    with pytest.raises(RuntimeError, match="the server stopped"):
        RoundLoop(stopped, _Echo(stopped, stop=2)).execute()
    again = _Echo(stopped)
    resumed = RoundLoop(stopped, again).execute()
    assert [r for r, _ in again.asked] == [2] and [r.round for r in resumed.rounds] == [0, 1, 2]
    assert all(torch.equal(resumed.state[k], v) for k, v in result.state.items())


class _Truths(Observer):
    def __init__(self):
        self.truths: dict[int, Any] = {}
        self.rounds: dict[int, int] = {}

    def on_upload(self, round, client, upload, nbytes, truth=None):
        self.truths[client] = truth
        self.rounds[client] = round


def test_an_accepted_upload_reaches_the_observers_with_what_its_client_really_did(job) -> None:
    """The audits' ground truth: the labels of the client's local steps when
    it trained here, else its data's labels, each saying which it is."""
    seen = _Truths()
    inbox = Inbox(job, Observers([seen]), checkpoints=None)
    steps = torch.tensor([2, 2, 1])
    turns = {
        0: ClientTurn(_raw(job, 0), None, step_labels=steps),
        1: ClientTurn(_raw(job, 1), None),
    }
    inbox.receive(job.method.init_state(), 0, turns)
    assert seen.truths[0] == {"labels": steps, "num_classes": 10, "label_source": "steps"}
    assert seen.truths[1]["label_source"] == "data" and seen.truths[1]["num_classes"] == 10
    assert torch.equal(seen.truths[1]["labels"], job.clients.data(1).labels)


def test_a_checked_upload_is_kept_with_its_state_and_warnings_and_a_crash_is_its_refusal(
    job, tmp_path, monkeypatch
) -> None:
    def screen(state, r, c, upload):
        if c == 2:
            raise ValueError("boom")
        return None

    monkeypatch.setattr(job.method, "screen", screen)
    seen = _Truths()
    inbox = Inbox(job, Observers([seen]), RoundCheckpoints(tmp_path))
    turns = {
        1: ClientTurn(_raw(job, 1), b"its state", warnings=("loss rose",)),
        2: ClientTurn(_raw(job, 2), None),
    }
    got = inbox.receive(job.method.init_state(), 5, turns)
    assert got.refused == {2: "[client 2, field '*'] ValueError while checking it: boom"}
    [kept] = inbox.kept(5, [1]).values()
    assert (kept.upload, kept.state, list(kept.warnings)) == (
        _raw(job, 1),
        b"its state",
        ["loss rose"],
    )
    assert seen.rounds == {1: 5}


def test_the_sample_count_bound_is_the_smaller_of_the_methods_and_the_clients(
    job, monkeypatch
) -> None:
    spec_of = job.method.upload_spec
    inbox = Inbox(job, Observers([]), checkpoints=None)
    size = job.clients.size(1)
    for own, want in ((3, 3), (10**9, size)):

        def with_high(state, r, c, own=own):
            spec = spec_of(state, r, c)
            count = dataclasses.replace(spec.meta["num_samples"], high=own)
            return dataclasses.replace(spec, meta={**spec.meta, "num_samples": count})

        monkeypatch.setattr(job.method, "upload_spec", with_high)
        assert inbox.spec_for(job.method.init_state(), 0, 1).meta["num_samples"].high == want


def test_without_any_byte_limit_an_upload_is_read_whole(job, monkeypatch) -> None:
    monkeypatch.setattr(rounds_module, "size_limit", lambda spec: None)
    run = dataclasses.replace(
        job.run, server=dataclasses.replace(job.run.server, max_upload_bytes=None)
    )
    inbox = Inbox(dataclasses.replace(job, run=run), Observers([]), checkpoints=None)
    assert inbox.accept(job.method.init_state(), 0, 1, _raw(job, 1)).meta["num_samples"] > 0


def test_every_hook_of_a_round_gets_its_round_and_the_state_it_acts_on(
    job, tmp_path, monkeypatch, caplog
) -> None:
    """Half the clients each round (the sampling generator matters): the
    sampler, broadcast, aggregation, scoring and observers see round r and
    the state round r starts from or ends with; a run stopped in round 2
    replays the sampling and resumes with the uninterrupted run's state."""
    board = RecordingBoard()
    run = dataclasses.replace(job.run, progress=board)
    halves = _rounds(dataclasses.replace(job, run=run), 3, {"client_fraction": 0.5}, eval_every=1)
    calls: list[tuple[Any, ...]] = []
    method = halves.method
    broadcast, aggregate = method.broadcast, method.aggregate
    monkeypatch.setattr(
        method, "broadcast", lambda s, r: calls.append(("broadcast", s, r)) or broadcast(s, r)
    )

    def aggregated(s, uploads, r):
        new = aggregate(s, uploads, r)
        calls.append(("aggregate", s, r, new))
        return new

    monkeypatch.setattr(method, "aggregate", aggregated)
    sample = rounds_module.sample_clients
    monkeypatch.setattr(
        rounds_module,
        "sample_clients",
        lambda m, r, n, rng: calls.append(("sample", r)) or sample(m, r, n, rng),
    )
    watch = _Watch()
    loop = RoundLoop(dataclasses.replace(halves, state_dir=tmp_path / "a"), _Echo(halves), [watch])
    scored = loop.evaluation.metrics
    monkeypatch.setattr(
        loop.evaluation,
        "metrics",
        lambda s, p, r, recs: calls.append(("score", s, r, len(recs))) or scored(s, p, r, recs),
    )
    result = loop.execute()
    assert watch.seen[0] == ("start", "fedavg", run)
    ends = [(e[1], e[2]) for e in watch.seen if e[0] == "end"]
    aggregates = [c for c in calls if c[0] == "aggregate"]
    assert [(r, s) for _, _, r, s in aggregates] == ends and ends[-1][1] is result.state
    starts = [a[1] for a in aggregates]
    broadcasts = [c for c in calls if c[0] == "broadcast"]
    assert [c[1] is st for c, st in zip(broadcasts, starts, strict=True)] == [True] * 3
    assert [a[3] for a in aggregates[:2]] == starts[1:]  # each round starts from the last's state
    assert [c[1] for c in calls if c[0] == "sample"] == [0, 1, 2]
    assert [c[1:] for c in calls if c[0] == "score"] == [
        (aggregates[0][3], 0, 1), (aggregates[1][3], 1, 2), (result.state, 2, 3)
    ]  # fmt: skip
    sent = [s[2] for s in watch.seen if s[0] == "broadcast"]
    assert sent == [c for r in result.rounds for c in r.clients] and len(sent) == 6
    assert [c[2] for c in broadcasts] == [0, 1, 2]
    assert [(b.total, b.advances) for b in board.named("fedavg: rounds")] == [(3, [1.0] * 3)]

    stopped = dataclasses.replace(halves, state_dir=tmp_path / "b")
    with pytest.raises(RuntimeError, match="the server stopped"):
        RoundLoop(stopped, _Echo(stopped, stop=2)).execute()
    board.bars.clear()
    with caplog.at_level(logging.INFO, "osfl.fl.runtime.rounds"):
        again = RoundLoop(stopped, _Echo(stopped))
        resumed = again.execute()
    assert again.rng.bit_generator.state == loop.rng.bit_generator.state  # 3 draws each
    assert "fedavg: resuming after round 2 of 3" in [r.getMessage() for r in caplog.records]
    assert [r.clients for r in resumed.rounds] == [r.clients for r in result.rounds]
    assert all(torch.equal(resumed.state[k], v) for k, v in result.state.items())
    [rounds_bar] = board.named("fedavg: rounds")
    assert rounds_bar.advances == [2, 1.0]  # the two finished rounds at once, then the third


def test_a_one_round_run_has_no_rounds_bar(job) -> None:
    board = RecordingBoard()
    once = dataclasses.replace(job, run=dataclasses.replace(job.run, progress=board))
    RoundLoop(once, _Echo(once)).execute()
    assert not [b for b in board.bars if b.name.endswith(": rounds")]


class _Said(_Echo):
    """Client 1 warns, client 2 keeps a state, the threads are noted; in
    round ``garbage`` every client but 0 sends bytes that are no upload."""

    def __init__(self, job: Any, garbage: int | None = None):
        super().__init__(job)
        self.garbage, self.threads = garbage, []

    def exchange(self, round, clients, payload, task):
        self.threads.append(torch.get_num_threads())
        turns = super().exchange(round, clients, payload, task)
        for c, turn in turns.items():
            upload = b"junk" if round == self.garbage and c != 0 else turn.upload
            turns[c] = ClientTurn(upload, None, warnings=("w",) if c == 1 else ())
        return turns

    def client_states(self):
        return {2: ClientState(tensors={"c": torch.zeros(1)}, meta={})}


def test_a_rounds_record_and_the_result_carry_warnings_and_states_under_its_threads(job) -> None:
    before = torch.get_num_threads()
    transport = _Said(job)
    result = RoundLoop(job, transport, threads=before + 1).execute()
    assert transport.threads == [before + 1] and torch.get_num_threads() == before
    assert result.rounds[0].warnings == {1: ["w"]}
    assert list(result.client_states) == [2]


def test_a_round_with_too_few_usable_uploads_names_its_round_and_clients(job) -> None:
    run = dataclasses.replace(job.run, server=dataclasses.replace(job.run.server, min_clients=2))
    two = _rounds(dataclasses.replace(job, run=run), 2)
    with pytest.raises(
        UploadError, match=r"^round 1: 1 usable upload\(s\) of 4 client\(s\), fewer"
    ):
        RoundLoop(two, _Said(two, garbage=1)).execute()


def test_a_run_without_a_server_test_set_is_scored_at_the_sites(job, monkeypatch) -> None:
    sites = dataclasses.replace(job, evaluate_at_clients=True)
    transport = _Echo(sites)
    loop = RoundLoop(sites, transport)
    assert loop.evaluation.transport is transport
    scored: list[Any] = []
    monkeypatch.setattr(
        loop.evaluation, "at_sites", lambda state: scored.append(state) or {"site_accuracy": 0.5}
    )
    result = loop.execute()
    assert scored == [result.state] and result.metrics == {"site_accuracy": 0.5}


def test_times_add_up_on_a_clock_that_ticks_at_every_reading(job, monkeypatch) -> None:
    """Every reading of the clock one second on, from 10⁶: each measured
    span is a few seconds, none is negative, the inbox's checks count as
    the server's, not the clients', and the server's time holds more than
    its rounds' (its first state and its final predictor too)."""
    ticks = iter(range(10**6, 10**7))
    monkeypatch.setattr(rounds_module.time, "perf_counter", lambda: float(next(ticks)))
    result = RoundLoop(_rounds(job, 2), _Echo(job)).execute()
    spans = [t for r in result.rounds for t in (r.time_client_s, r.time_server_s)]
    assert all(0 <= t < 100 for t in spans)
    # a round reads the clock 8 times: around the broadcast (1 s of server),
    # around the collection (3 s, of which the inbox's checks, read inside it,
    # are 1 s of server: 2 s of clients) and around the aggregation (1 s)
    assert [(r.time_client_s, r.time_server_s) for r in result.rounds] == [(2.0, 3.0)] * 2
    times = result.time_s
    assert 0 <= times["server"] < 1000 and 0 <= times["client"] < 1000
    assert times["server"] > sum(r.time_server_s for r in result.rounds)
