"""The embedded repository's GPU variant (PyTorch, SDPA), run here on the CPU: the same code the
GPU runs, the same tensors, the scores of the ONNX export. On a CUDA machine the fp16/bf16
comparison runs too."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from keyrank.bench.workloads import dl20_requests
from keyrank.config import Settings
from keyrank.prepare.gpu_repository import REPOSITORY, write_gpu_repository
from keyrank.scoring import ModelInputs, bucket_batches
from keyrank.modelserver.python_models.torch_encoder import TorchCrossEncoder, flops_per_sequence
from keyrank.modelserver.repository import MODEL_NAME
from shared_data import CE_MODEL, DATASETS, embedded_scores

torch = pytest.importorskip("torch")
FIXED = [64, 128, 256, 384, 512]


@pytest.fixture(scope="module")
def gpu_models(prepared_models: Path, tmp_path_factory) -> Path:
    """A model directory with the real gateway assets and the GPU variant written for device=cpu, fp32."""
    out = tmp_path_factory.mktemp("gpu-models")
    (out / "gateway").symlink_to((prepared_models / "gateway").resolve())
    manifest = json.loads((prepared_models / "gateway" / "manifest.json").read_text())
    write_gpu_repository(out, manifest["cross_encoder"], CE_MODEL, device="cpu", dtype="float32", max_batch_size=64)
    return out


def _torch_scores(encoder: TorchCrossEncoder, mixed_inputs: ModelInputs) -> tuple[np.ndarray, np.ndarray]:
    logits, pooled = np.empty(len(mixed_inputs), np.float32), np.empty((len(mixed_inputs), 384), np.float32)
    for batch in bucket_batches(mixed_inputs, buckets=FIXED, batch_size=16, pad_id=0, max_shapes=4):
        out_logits, out_pooled = encoder(batch.input_ids, batch.attention_mask, batch.token_type_ids)
        logits[batch.rows], pooled[batch.rows] = out_logits[:, -1], out_pooled
    return logits, pooled


def _folder(gpu_models: Path) -> Path:
    return gpu_models / REPOSITORY / MODEL_NAME / "1"


def test_the_gpu_variants_code_on_cpu_in_fp32_gives_the_onnx_scores(gpu_models, mixed_inputs, mixed_fp32):
    encoder = TorchCrossEncoder(_folder(gpu_models), device="cpu", dtype="float32")
    logits, pooled = _torch_scores(encoder, mixed_inputs)
    np.testing.assert_allclose(logits, mixed_fp32.logits, atol=1e-4)
    np.testing.assert_allclose(pooled, mixed_fp32.pooled, atol=1e-4)


def test_half_precision_stays_within_tolerance_and_keeps_the_ranking(gpu_models, mixed_inputs, mixed_fp32):
    encoder = TorchCrossEncoder(_folder(gpu_models), device="cpu", dtype="bfloat16")  # bf16 runs on CPUs too
    logits, _ = _torch_scores(encoder, mixed_inputs)
    assert np.abs(logits - mixed_fp32.logits).max() < 0.1
    assert np.corrcoef(np.argsort(np.argsort(logits)), np.argsort(np.argsort(mixed_fp32.logits)))[0, 1] > 0.98


def _tensors(config: str) -> list[tuple[str, str, str]]:
    return re.findall(r'name: "(\w+)" data_type: (TYPE_\w+) dims: \[ ([^\]]+) \]', config)


def test_the_gpu_repository_declares_the_tensors_of_the_onnx_repositories(gpu_models, prepared_models):
    gpu = (gpu_models / REPOSITORY / MODEL_NAME / "config.pbtxt").read_text()
    for other in ("triton", "triton-embedded"):
        assert _tensors(gpu) == _tensors((prepared_models / other / MODEL_NAME / "config.pbtxt").read_text())
    assert 'key: "device" value: { string_value: "cpu" }' in gpu and 'backend: "python"' in gpu
    assert (_folder(gpu_models) / "torch_encoder.py").exists() and (_folder(gpu_models) / "checkpoint" / "tokenizer.json").exists()


def test_the_flop_count_used_for_percent_of_peak_agrees_with_torchs_flop_counter(gpu_models):
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForSequenceClassification

    # Eager attention: its two batched matmuls are counted (the CPU SDPA kernel is not).
    model = AutoModelForSequenceClassification.from_pretrained(_folder(gpu_models) / "checkpoint", attn_implementation="eager").eval()
    ids = torch.ones((1, 512), dtype=torch.long)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    config = json.loads((_folder(gpu_models) / "checkpoint" / "config.json").read_text())
    assert flops_per_sequence(config, 512) == pytest.approx(counter.get_total_flops(), rel=0.02)


def test_the_torch_scorer_ranks_like_onnx_runtime(gpu_models, prepared_models):
    from keyrank.scoring.pytorch import TorchScorer
    from keyrank.reranker import Reranker

    query, docs = dl20_requests(DATASETS, 2)[1]
    settings = Settings(model_dir=prepared_models)
    with Reranker(settings, scorer=TorchScorer(_folder(gpu_models), pad_id=0, device="cpu", dtype="float32")) as reranker:
        torch_ranking = reranker.rank(query, docs[:20], strategy="maxp")
    # Reranker.torch builds the same from the prepared folder (the GPU gateway's and a teacher's way in;
    # its length buckets come from the settings, so the batches, and the last float bits, may differ).
    with Reranker.torch(gpu_models, device="cpu") as built:
        assert built.scorer.encoder.dtype == torch.float32  # the weights' dtype, read from encoder.json
        assert [r.score for r in built.rank(query, docs[:20], strategy="maxp").results] == pytest.approx([r.score for r in torch_ranking.results], abs=1e-5)
    with Reranker.local(prepared_models, threads=2) as local:
        onnx_ranking = local.rank(query, docs[:20], strategy="maxp")
    assert [r.index for r in torch_ranking.results] == [r.index for r in onnx_ranking.results]
    np.testing.assert_allclose([r.score for r in torch_ranking.results], [r.score for r in onnx_ranking.results], atol=1e-4)


@pytest.mark.triton
def test_embedded_triton_serves_the_gpu_variant_with_the_onnx_scores(gpu_models, mixed_inputs, mixed_fp32):
    settings = Settings(model_dir=gpu_models, embedded_http_port=0, embedded_grpc_port=0, embedded_metrics_port=0)
    scores = embedded_scores(gpu_models / REPOSITORY, settings, mixed_inputs)
    np.testing.assert_allclose(scores.logits, mixed_fp32.logits, atol=1e-4)
    np.testing.assert_allclose(scores.pooled, mixed_fp32.pooled, atol=1e-4)
    # model.py imported torch_encoder.py and grouping.py from beside itself, and compiled none of them there.
    assert list((gpu_models / REPOSITORY).rglob("__pycache__")) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the GPU machine)")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_on_cuda_half_precision_scores_are_within_fp16_tolerance_of_fp32_onnx(gpu_models, mixed_inputs, mixed_fp32, dtype):
    for graphs in (False, True):
        encoder = TorchCrossEncoder(_folder(gpu_models), device="cuda", dtype=dtype, cuda_graphs=graphs)
        logits, pooled = _torch_scores(encoder, mixed_inputs)
        assert np.abs(logits - mixed_fp32.logits).max() < 0.1, (dtype, graphs)
        assert np.abs(pooled - mixed_fp32.pooled).max() < 0.05, (dtype, graphs)


def test_the_kernel_split_of_the_gpu_benchmark_accounts_for_the_encoders_time(gpu_models):
    # On a GPU it splits CUDA kernel time; here the same code splits the CPU operators' time.
    from keyrank.bench.gpu import kernel_split

    encoder = TorchCrossEncoder(_folder(gpu_models), device="cpu", dtype="float32")
    split = kernel_split(encoder, np.ones((2, 128), dtype=np.int64))
    assert split["device_ms"] > 0 and sum(split["share"].values()) == pytest.approx(1.0)
    assert set(split["share"]) == {"matmul", "attention", "copy", "other"}
    assert split["share"]["matmul"] > 0.2 and split["share"]["attention"] > 0, split


def test_the_compiled_body_gives_the_eager_scores_on_every_shape(gpu_models, mixed_inputs, mixed_fp32):
    # torch.compile (inductor; here its CPU kernels) with symbolic shapes: the mixed lengths' buckets and batch
    # sizes all go through the one compiled body and score as the ONNX export does.
    encoder = TorchCrossEncoder(_folder(gpu_models), device="cpu", dtype="float32", compiled=True)
    logits, pooled = _torch_scores(encoder, mixed_inputs)
    np.testing.assert_allclose(logits, mixed_fp32.logits, atol=1e-4)
    np.testing.assert_allclose(pooled, mixed_fp32.pooled, atol=1e-4)
    assert encoder.compiled


def test_a_variant_that_fails_is_reported_and_the_encoder_rows_go_on(gpu_models, monkeypatch):
    # On a GPU machine without a working compiler torch.compile raises at the first batch: the benchmark must keep
    # the other rows (and go on to its HTTP part) instead of losing the run.
    from keyrank.bench.gpu import encoder_saturation

    def no_compiler(*_args, **_kwargs):
        raise RuntimeError("no C compiler found")

    monkeypatch.setattr(torch, "compile", no_compiler)
    rows = np.random.default_rng(0).integers(1000, 5000, size=(4, 32))
    out = encoder_saturation(_folder(gpu_models), rows, peak_tflops=1.0, seconds=0.05, device="cpu", batches=(2,))
    assert set(out["variants"]) == {"bf16", "fp16", "bf16+graphs"}
    assert out["failed"] == {"fp16+compile": "RuntimeError: no C compiler found"}
    assert set(out["kernels_bf16"]["share"]) == {"matmul", "attention", "copy", "other"}
