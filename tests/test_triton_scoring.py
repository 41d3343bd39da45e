"""The Triton stage against the real embedded tritonserver on the real exported model:
same scores as ONNX Runtime in-process, order kept, padding harmless, and a dead or
slow Triton turned into ScoringUnavailable quickly, with recovery on the same client."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from keyrank.config import Settings
from keyrank.errors import ScoringUnavailable
from keyrank.scoring import ModelInputs, bucket_batches
from keyrank.scoring.triton import TritonScorer
from keyrank.modelserver.embedded import EmbeddedTriton, EmbeddedTritonError
from tokenizers import Tokenizer
from shared_data import linked_copy

# Real text of very different lengths, so the pairs land in every bucket (64..512).
_NORMANS = (
    "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, "
    "a region in France. They were descended from Norse raiders and pirates from Denmark, Iceland "
    "and Norway who, under their leader Rollo, agreed to swear fealty to King Charles III of West Francia. "
)
_PAIRS = [
    ("what is a cat", "a cat is an animal"),
    ("who was rollo", _NORMANS),
    ("how do cats purr", "Cats purr by vibrating the muscles of the larynx while breathing in and out."),
    ("in what country is normandy located", _NORMANS * 3),
    ("bananas", "no"),
    ("who swore fealty to charles iii", _NORMANS * 6),
    ("norse raiders", _NORMANS * 12),  # past 512 tokens: cut to 512
    ("what colour is a banana", "Bananas are yellow when ripe and green before."),
    ("when did the normans live", _NORMANS * 2),
    ("where is west francia", _NORMANS * 4),
]


@pytest.fixture(scope="module")
def onnx_session(prepared_models: Path) -> ort.InferenceSession:
    """The production graph (models/triton/...), run in-process: the reference."""
    return ort.InferenceSession(
        str(Path(prepared_models) / "triton" / "cross_encoder" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )


@pytest.fixture(scope="module")
def sequences(prepared_models: Path) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """[CLS] q [SEP] p [SEP] ids and type ids of the pairs (21 of them), and the pad id."""
    tokenizer = Tokenizer.from_file(str(Path(prepared_models) / "gateway" / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(512, strategy="only_second")
    pairs = _PAIRS + [(q + " today", p + " Indeed.") for q, p in _PAIRS] + [("rollo", "Rollo.")]
    encodings = tokenizer.encode_batch(pairs)
    ids = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
    types = [np.asarray(e.type_ids, dtype=np.int64) for e in encodings]
    pad_id = tokenizer.token_to_id("[PAD]") or 0
    return ids, types, pad_id


def _reference(session: ort.InferenceSession, ids: list[np.ndarray], types: list[np.ndarray]):
    """Unpadded, one sequence per run: what the model says with no bucketing at all."""
    logits, pooled = [], []
    for i, t in zip(ids, types):
        out = session.run(
            ["logits", "pooled"],
            {"input_ids": i[None], "attention_mask": np.ones_like(i)[None], "token_type_ids": t[None]},
        )
        logits.append(out[0][0, 0])
        pooled.append(out[1][0])
    return np.asarray(logits, dtype=np.float32), np.stack(pooled)


def _at_most(length: int, ids, types, pad_id):
    keep = [k for k, i in enumerate(ids) if len(i) <= length]
    return [ids[k] for k in keep], [types[k] for k in keep], pad_id


def _settings(**overrides) -> Settings:
    # Small batches and few slots so 21 sequences make several concurrent requests per bucket.
    return Settings(triton_batch_size=4, triton_max_in_flight=3, **overrides)


async def _with_scorer(url: str, pad_id: int, body, settings: Settings | None = None):
    s = settings or _settings()
    scorer = TritonScorer(
        url, model=s.triton_model, pad_id=pad_id, buckets=s.length_buckets, batch_size=s.triton_batch_size,
        max_in_flight=s.triton_max_in_flight, probe_timeout_s=s.triton_connect_timeout_s,
    )
    try:
        return await body(scorer)
    finally:
        await scorer.close()


def _score(url, pad_id, ids, types, *, want_pooled=True, timeout=60.0, settings=None):
    async def body(scorer):
        scores = await scorer.score(ModelInputs(list(ids), list(types)), want_pooled=want_pooled, deadline=time.monotonic() + timeout)
        return scores.logits, scores.pooled

    return asyncio.run(_with_scorer(url, pad_id, body, settings))


# --- bucketing (no server) ------------------------------------------------------------


def test_sequences_go_to_the_smallest_bucket_that_fits_in_batches_of_at_most_batch_size(sequences):
    ids, types, pad_id = sequences
    batches = bucket_batches(ModelInputs(list(ids), list(types)), buckets=[64, 128, 256, 384, 512], batch_size=4, pad_id=pad_id)
    seen = np.concatenate([b.rows for b in batches])
    assert sorted(seen.tolist()) == list(range(len(ids)))
    lengths = {len(ids[r]) for b in batches for r in b.rows}
    assert max(lengths) == 512 and min(lengths) < 64
    for b in batches:
        width = b.input_ids.shape[1]
        assert b.input_ids.shape[0] <= 4
        for r, row in enumerate(b.rows):
            n = len(ids[row])
            assert n <= width and not any(n <= smaller for smaller in (64, 128, 256, 384, 512) if smaller < width)
            assert b.attention_mask[r].sum() == n and (b.input_ids[r, n:] == pad_id).all()
            np.testing.assert_array_equal(b.input_ids[r, :n], ids[row])
            np.testing.assert_array_equal(b.token_type_ids[r, :n], types[row])


def test_padding_to_buckets_does_not_change_onnx_scores(onnx_session, sequences):
    ids, types, pad_id = sequences
    want_logits, want_pooled = _reference(onnx_session, ids, types)
    for batch in bucket_batches(ModelInputs(list(ids), list(types)), buckets=[64, 128, 256, 384, 512], batch_size=4, pad_id=pad_id):
        logits, pooled = onnx_session.run(
            ["logits", "pooled"],
            {
                "input_ids": batch.input_ids,
                "attention_mask": batch.attention_mask,
                "token_type_ids": batch.token_type_ids,
            },
        )
        np.testing.assert_allclose(logits[:, 0], want_logits[batch.rows], atol=1e-4, rtol=0)
        np.testing.assert_allclose(pooled, want_pooled[batch.rows], atol=1e-4, rtol=0)


def test_a_sequence_longer_than_the_largest_bucket_is_refused(sequences):
    ids, types, pad_id = sequences
    too_long = np.ones(513, dtype=np.int64)
    with pytest.raises(ValueError, match="1..512"):
        bucket_batches(ModelInputs(list([too_long]), list([too_long])), buckets=[64, 512], batch_size=4, pad_id=pad_id)


def test_missing_pytriton_wheel_says_how_to_install_it(monkeypatch, prepared_models):
    monkeypatch.setitem(sys.modules, "pytriton", None)  # import pytriton -> ImportError
    server = EmbeddedTriton(Path(prepared_models) / "triton-embedded", settings=_settings())
    with pytest.raises(EmbeddedTritonError, match=r"pip install keyrank\[embedded\]"):
        server.start()
    server.close()


# --- against the embedded Triton ---------------------------------------------------------


@pytest.mark.triton
def test_triton_scores_equal_in_process_onnx_runtime(embedded_triton, onnx_session, sequences):
    ids, types, pad_id = sequences
    want_logits, want_pooled = _reference(onnx_session, ids, types)
    assert np.ptp(want_logits) > 1.0  # the pairs really differ, so a mix-up would show

    logits, pooled = _score(embedded_triton.grpc_url, pad_id, ids, types, want_pooled=True)

    assert logits.shape == (len(ids),) and pooled.shape == want_pooled.shape
    np.testing.assert_allclose(logits, want_logits, atol=1e-4, rtol=0)
    np.testing.assert_allclose(pooled, want_pooled, atol=1e-4, rtol=0)


@pytest.mark.triton
def test_scores_come_back_in_the_callers_order(embedded_triton, sequences):
    ids, types, pad_id = _at_most(256, *sequences)  # three buckets, several batches; cheaper than all
    order = np.random.default_rng(7).permutation(len(ids))

    forward, _ = _score(embedded_triton.grpc_url, pad_id, ids, types, want_pooled=False)
    shuffled, nothing = _score(
        embedded_triton.grpc_url, pad_id, [ids[i] for i in order], [types[i] for i in order], want_pooled=False
    )

    assert nothing is None
    assert len(np.unique(np.round(forward, 4))) == len(ids)
    np.testing.assert_allclose(shuffled, forward[order], atol=1e-4, rtol=0)


@pytest.mark.triton
def test_concurrent_callers_sharing_one_scorer_each_get_their_own_scores(embedded_triton, sequences):
    ids, types, pad_id = _at_most(128, *sequences)
    subsets = [list(range(0, len(ids), 2)), list(range(1, len(ids), 2)), list(range(len(ids)))[::-1]]
    alone, _ = _score(embedded_triton.grpc_url, pad_id, ids, types, want_pooled=False)

    async def body(scorer):
        calls = [
            scorer.score(ModelInputs([ids[k] for k in ks], [types[k] for k in ks]), want_pooled=False,
                         deadline=time.monotonic() + 60)
            for ks in subsets
        ]
        return await asyncio.gather(*calls)

    together = asyncio.run(_with_scorer(embedded_triton.grpc_url, pad_id, body))
    for ks, scored in zip(subsets, together):
        np.testing.assert_allclose(scored.logits, alone[ks], atol=1e-4, rtol=0)


@pytest.mark.triton
def test_scorer_reports_the_model_ready_and_its_tensors(embedded_triton, sequences):
    async def body(scorer):
        return await scorer.ready(), await scorer.model_metadata()

    ready, metadata = asyncio.run(_with_scorer(embedded_triton.grpc_url, sequences[2], body))
    assert ready is True
    assert {t["name"] for t in metadata["inputs"]} == {"input_ids", "attention_mask", "token_type_ids"}
    assert {t["name"] for t in metadata["outputs"]} == {"logits", "pooled"}


@pytest.mark.triton
def test_a_deadline_nearly_past_fails_fast_instead_of_hanging(embedded_triton, sequences):
    ids, types, pad_id = sequences
    long_ones = [i for i in ids if len(i) > 384] * 2
    long_types = [t for t in types if len(t) > 384] * 2

    async def body(scorer):
        outcomes = []
        for budget in (-1.0, 0.001, 0.2):  # already past, nearly past, past mid-flight
            started = time.monotonic()
            with pytest.raises(ScoringUnavailable, match="deadline"):
                await scorer.score(ModelInputs(long_ones, long_types), want_pooled=False, deadline=started + budget)
            outcomes.append(time.monotonic() - started)
        return outcomes

    took = asyncio.run(_with_scorer(embedded_triton.grpc_url, pad_id, body))
    assert took[0] < 0.05 and took[1] < 0.1 and took[2] < 0.5, took


@pytest.mark.triton
def test_dead_triton_fails_fast_and_the_same_client_recovers_after_restart(embedded_triton, sequences):
    ids, types, pad_id = _at_most(128, *sequences)
    server = embedded_triton

    async def body(scorer):
        before = (await scorer.score(ModelInputs(ids, types), want_pooled=False, deadline=time.monotonic() + 60)).logits
        server.kill()
        try:
            started = time.monotonic()
            with pytest.raises(ScoringUnavailable):
                await scorer.score(ModelInputs(ids, types), want_pooled=False, deadline=time.monotonic() + 30)
            failed_in = time.monotonic() - started
            started = time.monotonic()
            ready = await scorer.ready(timeout=5.0)
            not_ready_in = time.monotonic() - started
        finally:
            ready_in = await asyncio.to_thread(server.restart, 120)
        started = time.monotonic()
        await scorer.score(ModelInputs(ids[:1], types[:1]), want_pooled=False, deadline=time.monotonic() + 60)
        recovered_in = time.monotonic() - started
        after = (await scorer.score(ModelInputs(ids, types), want_pooled=False, deadline=time.monotonic() + 60)).logits
        return before, after, failed_in, ready, not_ready_in, ready_in, recovered_in

    before, after, failed_in, ready, not_ready_in, ready_in, recovered_in = asyncio.run(
        _with_scorer(server.grpc_url, pad_id, body)
    )
    print(f"dead: score failed in {failed_in:.4f} s, ready() False in {not_ready_in:.4f} s; "
          f"restart ready in {ready_in:.1f} s; first one-pair score after restart {recovered_in:.2f} s")
    assert failed_in < 1.0 and not_ready_in < 1.0 and ready is False
    np.testing.assert_allclose(after, before, atol=1e-4, rtol=0)


# --- the launcher's process hygiene ------------------------------------------------------


def _process_group(pgid: int) -> set[int]:
    """Pids whose process group is ``pgid`` (tritonserver and its backend stubs)."""
    members = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
                members.add(int(entry.name))
    return members


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def _live_in_group(pgid: int, within: float) -> set[int]:
    """Live members of the group, polled for up to ``within`` seconds until there are none.

    Killed stubs are reparented to init when tritonserver exits first; until init reaps them
    they stay in the group as zombies (dead, holding nothing), so only live ones are leaks.
    """
    deadline = time.monotonic() + within
    while (live := _alive(_process_group(pgid))) and time.monotonic() < deadline:
        time.sleep(0.05)
    return live


def _commands(pids: set[int]) -> list[str]:
    return [Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode() for pid in pids]


@pytest.mark.triton
def test_stop_leaves_no_tritonserver_or_backend_stub_behind(prepared_models):
    settings = _settings(embedded_http_port=0, embedded_grpc_port=0, embedded_metrics_port=0)
    with EmbeddedTriton(Path(prepared_models) / "triton-embedded", settings=settings) as server:
        work_dir, pgid = server.work_dir, server.pid
        group = _process_group(pgid)
        commands = _commands(group)
        assert any("tritonserver" in c for c in commands) and any("triton_python_backend_stub" in c for c in commands)
    assert _alive(group) == set() and _live_in_group(pgid, within=5.0) == set()
    assert not work_dir.exists()
    assert not list(Path("/dev/shm").glob(server._shm_prefix + "*"))


@pytest.mark.triton
def test_embedded_triton_dies_with_the_process_that_started_it(prepared_models, tmp_path):
    # A gateway killed with SIGKILL runs no cleanup: the kernel's parent-death signal must do it.
    script = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from keyrank.config import Settings
        from keyrank.modelserver.embedded import EmbeddedTriton
        settings = Settings(embedded_http_port=0, embedded_grpc_port=0, embedded_metrics_port=0)
        server = EmbeddedTriton(Path({str(Path(prepared_models) / "triton-embedded")!r}), settings=settings,
                                work_dir=Path({str(tmp_path)!r}))
        server.start()
        server.wait_ready(120)
        print(os.getpid(), server.pid, flush=True)
        os._exit(0)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    gateway, pgid = map(int, out.stdout.split()[-2:])
    live = _live_in_group(pgid, within=10.0)
    assert live == set(), _commands(live)
    # Its shared-memory regions could not be removed by it (one region was left here, every run): the
    # next embedded Triton removes them (leftovers.py).
    print(f"regions the killed gateway left: {len(list(Path('/dev/shm').glob(f'keyrank_{gateway}_*')))}")
    EmbeddedTriton(Path(prepared_models) / "triton-embedded", settings=_settings(embedded_http_port=0, embedded_grpc_port=0,
                                                                               embedded_metrics_port=0), supervise=False).close()
    assert not list(Path("/dev/shm").glob(f"keyrank_{gateway}_*"))
    assert (tmp_path / "tritonserver.log").exists()  # the caller's work dir is the caller's: never swept


def _files(root: Path) -> dict[str, int]:
    """Every file and folder under ``root`` with its modification time: an entry added anywhere changes it."""
    return {str(path.relative_to(root)): path.stat().st_mtime_ns for path in sorted(root.rglob("*"))}


@pytest.mark.triton
def test_the_model_process_writes_nothing_beside_the_model(prepared_models, tmp_path):
    # A read-only model volume is the norm in a container. The stub runs Python isolated (no
    # PYTHONDONTWRITEBYTECODE), and compiled model.py and grouping.py into a __pycache__ beside them.
    repository = linked_copy(Path(prepared_models) / "triton-embedded", tmp_path / "triton-embedded")
    before = _files(repository)
    settings = _settings(embedded_http_port=0, embedded_grpc_port=0, embedded_metrics_port=0)
    with EmbeddedTriton(repository, settings=settings) as server:
        assert server.admin.probe_inference(server.model, timeout=60) is None  # model.py and grouping.py ran
    assert _files(repository) == before


@pytest.mark.triton
def test_a_model_that_fails_to_load_is_reported_with_the_server_log(prepared_models, tmp_path):
    source = Path(prepared_models) / "triton-embedded" / "cross_encoder"
    broken = tmp_path / "repo" / "cross_encoder"
    (broken / "1").mkdir(parents=True)
    (broken / "config.pbtxt").write_text((source / "config.pbtxt").read_text())
    (broken / "1" / "model.py").write_text(
        "class TritonPythonModel:\n    def initialize(self, args):\n        raise RuntimeError('weights are gone')\n"
    )
    settings = _settings(embedded_http_port=0, embedded_grpc_port=0, embedded_metrics_port=0)
    server = EmbeddedTriton(tmp_path / "repo", settings=settings)
    try:
        server.start()
        with pytest.raises(EmbeddedTritonError, match="weights are gone"):
            server.wait_ready(60)
    finally:
        server.close()


@pytest.mark.triton
def test_scorer_is_not_ready_on_a_triton_that_is_not_the_expected_one(embedded_triton, sequences):
    """Another process answering on the port (a second instance's Triton) must not pass readiness."""
    s = _settings()

    async def ready_as(server_id):
        scorer = TritonScorer(embedded_triton.grpc_url, model=s.triton_model, pad_id=sequences[2], server_id=server_id)
        try:
            return await scorer.ready(timeout=5.0)
        finally:
            await scorer.close()

    assert asyncio.run(ready_as(embedded_triton.server_id)) is True
    assert asyncio.run(ready_as("someone-else")) is False


@pytest.mark.triton
def test_a_heavy_requests_batches_are_sized_when_granted_and_answer_as_any_others(embedded_triton, onnx_session, sequences):
    """Heavy (costlier than small_sequences): pieces of one sequence joined into batches as slots are granted,
    one sequence while a small request is about, else what the server drains in heavy_batch_s (measured);
    every score back at its row."""
    from keyrank.scoring.fairness import costing

    ids, types, pad_id = sequences
    ids, types = ids * 3, types * 3  # 63 sequences: enough busy time for the gate to measure its pace
    want_logits, _ = _reference(onnx_session, ids[:21], types[:21])
    sent: list[int] = []

    async def body():
        scorer = TritonScorer(embedded_triton.grpc_url, model="cross_encoder", pad_id=pad_id, batch_size=32,
                              max_in_flight=4, small_sequences=16, heavy_in_flight=2, heavy_batch_s=10.0, heavy_yield_s=60.0)
        infer = scorer._infer

        async def counting(client, gate, batch, *args):
            sent.append(batch.rows.size)
            return await infer(client, gate, batch, *args)

        scorer._infer = counting
        try:
            inputs = ModelInputs(list(ids), list(types))
            with costing(100):
                first = await scorer.score(inputs, want_pooled=False, deadline=time.monotonic() + 120)
            alone = list(sent)
            sent.clear()
            with costing(3):  # a small request: from now on heavy batches yield (heavy_yield_s)
                await scorer.score(ModelInputs(ids[:2], types[:2]), want_pooled=False, deadline=time.monotonic() + 60)
            sent.clear()
            with costing(100):
                second = await scorer.score(inputs, want_pooled=False, deadline=time.monotonic() + 120)
            return first.logits, second.logits, alone, list(sent)
        finally:
            await scorer.close()

    first, second, alone, yielding = asyncio.run(body())
    for logits in (first, second):
        np.testing.assert_allclose(logits, np.tile(want_logits, 3), atol=1e-4, rtol=0)
    assert sum(alone) == 63 and alone[0] == 1 and max(alone) > 1  # one sequence until the pace is measured
    assert yielding == [1] * 63


@pytest.mark.triton
def test_a_small_request_cancels_a_heavy_batch_and_the_heavy_request_still_answers_every_row(embedded_triton, onnx_session, sequences):
    """A small request's batch cancels the heavy batch being computed (more than one sequence) and those queued
    behind it; their sequences are sent again, so the heavy request answers every row as fixed batches do."""
    from keyrank import metrics
    from keyrank.scoring.fairness import costing

    ids, types, pad_id = sequences
    ids, types = ids * 3, types * 3
    want_logits, _ = _reference(onnx_session, ids[:21], types[:21])
    preempted = metrics.HEAVY_PREEMPTED._value.get()

    async def body():
        scorer = TritonScorer(embedded_triton.grpc_url, model="cross_encoder", pad_id=pad_id, batch_size=32,
                              max_in_flight=4, small_sequences=16, heavy_in_flight=2, heavy_batch_s=10.0, heavy_yield_s=0.5)
        try:
            inputs = ModelInputs(list(ids), list(types))
            with costing(100):  # measures the pace: from now on heavy batches are as long as 10 s allows (32)
                await scorer.score(inputs, want_pooled=False, deadline=time.monotonic() + 120)
            await asyncio.sleep(0.6)  # past the yield: the next heavy request sends full batches again

            async def small():
                # Until a batch of several of its sequences is on its way: a fixed sleep raced the heavy request
                # on a fast machine (all of it answered before the small one came, and nothing was preempted).
                _, gate = scorer._connection()
                while not any(rows > 1 and not call.done() for call, rows, _, _ in gate._heavy_calls):
                    assert time.monotonic() < started + 60, "no heavy batch of several sequences was sent"
                    await asyncio.sleep(0.001)
                with costing(3):
                    t0 = time.monotonic()
                    await scorer.score(ModelInputs(ids[:2], types[:2]), want_pooled=False, deadline=time.monotonic() + 60)
                    return time.monotonic() - t0

            started = time.monotonic()
            with costing(100):
                heavy, small_s = await asyncio.gather(
                    scorer.score(inputs, want_pooled=False, deadline=time.monotonic() + 120), small())
            return heavy.logits, small_s
        finally:
            await scorer.close()

    heavy, small_s = asyncio.run(body())
    np.testing.assert_allclose(heavy, np.tile(want_logits, 3), atol=1e-4, rtol=0)
    assert metrics.HEAVY_PREEMPTED._value.get() > preempted
