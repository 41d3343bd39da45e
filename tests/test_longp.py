"""LongP on long-context rerankers: the whole document in one sequence, up to the model's own length.

Tiny ModernBERT, XLM-R and decoder (Qwen3) checkpoints whose positions reach 4k-8k tokens (tests/families.py),
prepared with `keyrank prepare` and scored on the real embedded Triton: the length comes from the model's
config, Triton is warmed up and fed at widths up to it, the scores are PyTorch's on the whole unpadded
sequence, and the model process runs a batch of the longest width a row at a time.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
from families import DECODER_FAMILIES, build_family, served_side_by_side
from keyrank.config import Settings
from keyrank.pipeline import Pipeline, RerankOptions
from keyrank.reranker import Reranker
from keyrank.scoring.buckets import long_widths

LONG = {"modernbert": 8192, "xlm-roberta": 4096, "qwen3": 6144}
"""Each family's positions: ModernBERT's 8k, an XLM-R long variant's 4k, a decoder's 6k."""
QUERY = "who chaired the budget meeting"
SENTENCE = "The committee met again to discuss the budget and the roads while the mayor chaired. "


def _model_name(kind: str) -> str:
    return "long_" + kind.replace("-", "_")


def _document(tokens: int, pipeline: Pipeline) -> str:
    """Repeated prose of about ``tokens`` tokens under ``pipeline``'s tokenizer."""
    (one,) = pipeline.tokenizer.encode_documents([SENTENCE])
    return SENTENCE * max(1, round(tokens / len(one)))


@pytest.fixture(scope="module")
def long_models(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """family -> (checkpoint, `keyrank prepare` output) of the long tiny models."""
    from keyrank.prepare.export import prepare

    out = {}
    for kind, length in LONG.items():
        checkpoint = build_family(kind, tmp_path_factory.mktemp(f"long-{kind}"), max_length=length)
        models = tmp_path_factory.mktemp(f"long-models-{kind}")
        prepare(str(checkpoint), models, bi_encoder=None, atol=1e-4)
        out[kind] = (checkpoint, models)
    return out


@pytest.fixture(scope="module")
def long_triton(long_models):
    """One embedded Triton serving every long model side by side (as long_<family>)."""
    with served_side_by_side({_model_name(kind): models for kind, (_, models) in long_models.items()}) as server:
        yield server


def _remote(long_models, long_triton, kind: str) -> Reranker:
    _, models = long_models[kind]
    settings = Settings(model_dir=models, triton_url=long_triton.grpc_url, triton_model=_model_name(kind))
    reranker = Reranker(settings)
    deadline = time.monotonic() + 60
    while not asyncio.run(reranker.ready()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return reranker


@pytest.mark.parametrize("kind", LONG)
def test_prepare_takes_the_length_from_the_config_and_warms_triton_up_to_it(long_models, kind):
    _, models = long_models[kind]
    manifest = json.loads((models / "gateway" / "manifest.json").read_text())["cross_encoder"]
    assert manifest["max_length"] == manifest["template"]["max_length"] == LONG[kind]
    config = (models / "triton-embedded" / "cross_encoder" / "config.pbtxt").read_text()
    warmed = sorted(int(w) for w in re.findall(r'name: "warmup_(\d+)"', config))
    assert warmed == list(range(32, 513, 32)) + list(long_widths(512, LONG[kind]))  # not every multiple past 512
    assert warmed[-1] == LONG[kind]


@pytest.mark.parametrize("kind", LONG)
def test_longp_reads_the_whole_document_and_reports_a_cut_only_past_the_models_length(long_models, kind):
    _, models = long_models[kind]
    pipeline = Pipeline.from_model_dir(Settings(model_dir=models, document_cache_bytes=0))
    docs = [_document(n, pipeline) for n in (1000, LONG[kind] - 400, LONG[kind] * 2)]
    plan = pipeline.plan(QUERY, docs, RerankOptions(strategy="longp"))
    assert len(plan.inputs) == len(docs)  # one sequence per document: no split, no selection
    (read_1k, total_1k), (read_long, total_long), (read_over, total_over) = plan.coverage
    assert read_1k == total_1k > 900 and read_long == total_long > LONG[kind] * 0.9
    assert plan.truncated == [False, False, True] and read_over < total_over
    assert max(len(ids) for ids in plan.inputs.ids) == LONG[kind]  # the model's own length, frame included
    firstp = pipeline.plan(QUERY, docs, RerankOptions(strategy="firstp"))
    assert max(len(ids) for ids in firstp.inputs.ids) == 512 and all(firstp.truncated)  # the others still read 512


def test_longp_as_the_default_on_a_512_token_model_is_refused_at_start_naming_the_setting_and_the_length(prepared_models):
    """Per request it is a 422; as the default every request that names no strategy would get that 422, so `keyrank
    serve` (before it starts Triton) and the Python API refuse to start with it."""
    import os
    import subprocess
    import sys

    from process_tree import free_port

    env = {**os.environ, "KEYRANK_MODEL_DIR": str(prepared_models), "KEYRANK_PORT": str(free_port()),
           "KEYRANK_DEFAULT_STRATEGY": "longp"}
    out = subprocess.run([sys.executable, "-m", "keyrank.cli", "serve"], env=env, capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    said = out.stderr
    assert "default_strategy (KEYRANK_DEFAULT_STRATEGY) is 'longp'" in said and f"the model in {prepared_models}" in said
    assert "reads at most 512 tokens" in said and "Traceback" not in said
    assert "starting embedded Triton" not in out.stdout  # refused before anything started
    with pytest.raises(ValueError, match=r"KEYRANK_DEFAULT_STRATEGY\) is 'longp'.*reads at most 512 tokens"):
        Reranker.local(prepared_models, default_strategy="longp")
    with Reranker.local(prepared_models, default_strategy="maxp") as reranker:  # a default it can serve starts
        assert reranker.rank(QUERY, [SENTENCE]).strategy == "maxp"


def _torch_scores(kind: str, checkpoint: Path, ids: list[np.ndarray]) -> np.ndarray:
    """The checkpoint in PyTorch on each whole sequence alone, unpadded."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    decoder = kind in DECODER_FAMILIES
    model = (AutoModelForCausalLM if decoder else AutoModelForSequenceClassification).from_pretrained(checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    out = []
    with torch.no_grad():
        for row in ids:
            logits = model(input_ids=torch.from_numpy(row)[None]).logits[0]
            out.append(float(logits[-1, yes] - logits[-1, no]) if decoder else float(logits[-1]))
    return np.asarray(out)


@pytest.mark.triton
@pytest.mark.parametrize("kind", LONG)
def test_longp_on_triton_scores_the_whole_document_as_pytorch_does(long_models, long_triton, kind):
    checkpoint, _ = long_models[kind]
    with _remote(long_models, long_triton, kind) as remote:
        docs = [_document(n, remote.pipeline) for n in (700, 2500, LONG[kind] - 300)]
        ranking = remote.rank(QUERY, docs, strategy="longp")
        plan = remote.pipeline.plan(QUERY, docs, RerankOptions(strategy="longp"))
    assert ranking.usage.scored_sequences == 3 and ranking.usage.truncated_documents == 0
    got = {r.index: r.score for r in ranking.results}
    want = _torch_scores(kind, checkpoint, plan.inputs.ids)
    np.testing.assert_allclose([got[i] for i in range(len(docs))], want, atol=1e-4, rtol=0)
    for result in ranking.results:  # the evidence is the whole text read, in one piece
        (evidence,) = result.evidence
        assert evidence.start == 0 and evidence.end >= len(docs[result.index].rstrip())


def _status_mb(pid: int, key: str) -> float:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith(key))
    return int(line.split()[1]) / 1024


@pytest.mark.triton
def test_the_model_process_runs_a_batch_of_the_longest_width_a_row_at_a_time(long_models, long_triton):
    # Triton's batcher may merge several longest-width sequences into one batch; the model process runs it
    # in slices of KEYRANK_EMBEDDED_RUN_TOKENS (4096) tokens, here one 8192-token row at a time, so its peak
    # is the warm-up's (one row of the longest width) whatever was merged.
    import tritonclient.grpc as grpcclient
    from process_tree import command_line, stubs_of

    kind, width = "modernbert", LONG["modernbert"]
    (stub,) = [p for p in stubs_of(long_triton.pid) if _model_name(kind) in command_line(p)]
    warmed = _status_mb(stub, "VmHWM")
    rows = 6
    inputs = []
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        array = np.ones((rows, width), np.int64) if name != "token_type_ids" else np.zeros((rows, width), np.int64)
        tensor = grpcclient.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    client = grpcclient.InferenceServerClient(long_triton.grpc_url)
    logits = client.infer(_model_name(kind), inputs, outputs=[grpcclient.InferRequestedOutput("logits")]).as_numpy("logits")
    peak = _status_mb(stub, "VmHWM")
    print(f"{kind} stub: peak {warmed:.0f} MB after the warm-up, {peak:.0f} MB after [{rows} x {width}]")
    assert logits.shape == (rows, 1) and np.allclose(logits, logits[0])
    assert peak < warmed * 1.15 + 32  # six rows merged cost what one did


MEASURED = (1024, 2048, 4096, 8192)
"""Input lengths of the speed and memory table (docs/PERFORMANCE.md, LongP)."""


@pytest.mark.slow
@pytest.mark.triton
def test_measure_longp_speed_and_memory(tmp_path_factory, monkeypatch):
    """Per family (8k-position tiny models) and input length L: the latency of a longp request of one document of
    L tokens on the embedded CPU Triton (maxp on the same document beside it), and the model process's peak and
    kept memory when L is its longest width (KEYRANK_LONGP_MAX_LENGTH=L at prepare and serve: the warm-up and
    every request stop there).

        pytest tests/test_longp.py -m slow -s -k measure
    """
    from keyrank.config import get_settings
    from keyrank.prepare.export import prepare
    from process_tree import command_line, stubs_of

    checkpoints = {kind: build_family(kind, tmp_path_factory.mktemp(f"bench-{kind}"), max_length=max(MEASURED))
                   for kind in LONG}
    folders = {kind: tmp_path_factory.mktemp(f"bench-models-{kind}") for kind in LONG}
    rows = []
    try:
        for length in MEASURED:
            monkeypatch.setenv("KEYRANK_LONGP_MAX_LENGTH", str(length))
            get_settings.cache_clear()
            for kind in LONG:  # after the first length only the configs are rewritten: the warm-up stops at L
                prepare(str(checkpoints[kind]), folders[kind], bi_encoder=None, atol=1e-4)
            with served_side_by_side({_model_name(kind): models for kind, models in folders.items()}) as server:
                for kind, models in folders.items():
                    rows.append(_measure(server, kind, models, length, command_line, stubs_of))
    finally:
        monkeypatch.delenv("KEYRANK_LONGP_MAX_LENGTH")
        get_settings.cache_clear()
    runtime = json.loads((folders["modernbert"] / "triton-embedded/cross_encoder/1/runtime.json").read_text())
    print(f"\nruntime {runtime}\n| model | input tokens | longp ms | tokens/s | maxp windows | maxp ms | "
          "stub peak MB | stub kept MB |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
          + "\n".join(row for _, row in sorted(rows)))


def _measure(server, kind: str, models: Path, length: int, command_line, stubs_of) -> tuple[tuple[str, int], str]:
    """One row of the table (with its sort key): a document of ``length`` input tokens, longp and maxp, five
    times each."""
    (stub,) = [p for p in stubs_of(server.pid) if _model_name(kind) in command_line(p)]
    settings = Settings(model_dir=models, triton_url=server.grpc_url, triton_model=_model_name(kind), request_timeout_s=600)
    with Reranker(settings) as remote:
        frame = remote.template.frame_tokens + len(remote.tokenizer.encode_query(QUERY, 32))
        doc = _document(length - frame, remote.pipeline)
        while len(remote.pipeline.plan(QUERY, [doc], RerankOptions(strategy="longp")).inputs.ids[0]) > length:
            doc = doc[: doc.rstrip().rfind(" ")]
        median = {}
        for strategy in ("longp", "maxp"):
            seconds = []
            for _ in range(5):
                started = time.perf_counter()
                ranking = remote.rank(QUERY, [doc], strategy=strategy)
                seconds.append(time.perf_counter() - started)
            median[strategy] = (float(np.median(seconds)), ranking.usage)
    (longp_s, usage), (maxp_s, maxp_usage) = median["longp"], median["maxp"]
    return (kind, length), (f"| {kind} | {usage.scored_tokens} | {longp_s * 1000:.0f} | {usage.scored_tokens / longp_s:,.0f} | "
            f"{maxp_usage.scored_sequences} | {maxp_s * 1000:.0f} | {_status_mb(stub, 'VmHWM'):.0f} | "
            f"{_status_mb(stub, 'VmRSS'):.0f} |")
