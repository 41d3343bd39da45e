"""The cross-encoder on ONNX Runtime's CUDA provider (prepare/ort_cuda.py, scoring/local.py): the fp16 graph,
the provider choice, I/O binding and the fall back to the CPU, run here on the CPU. On a machine whose
onnxruntime has a working CUDA provider the GPU test runs too."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from keyrank.bench.workloads import dl20_requests
from keyrank.config import Settings
from keyrank.modelserver.repository import MODEL_NAME
from keyrank.prepare import ort_cuda
from keyrank.reranker import Reranker
from keyrank.scoring.local import CUDA, LocalScorer, cuda_providers
from shared_data import DATASETS, embedded_scores

FIXED = [64, 128, 256, 384, 512]
HAS_CUDA = CUDA in ort.get_available_providers()


@pytest.fixture(scope="module")
def ort_models(prepared_models: Path, tmp_path_factory) -> Path:
    """A model directory with the real export, gateway assets and CPU repository, and the fp16 CUDA repository
    written by the code `keyrank prepare --device cuda` runs."""
    out = tmp_path_factory.mktemp("ort-cuda-models")
    for name in ("gateway", "triton", "triton-embedded"):
        (out / name).symlink_to((prepared_models / name).resolve())
    manifest = json.loads((prepared_models / "gateway" / "manifest.json").read_text())
    entry = ort_cuda.write_ort_cuda_repository(out, manifest["cross_encoder"], ort_cuda.sample_rows(out, DATASETS), max_batch_size=64)
    (out / "entry.json").write_text(json.dumps(entry))
    return out


def _fp16(ort_models: Path) -> Path:
    return ort_models / ort_cuda.REPOSITORY / MODEL_NAME / "1" / "model.onnx"


def test_the_fp16_graph_keeps_the_exports_tensors_and_its_scores(ort_models, mixed_inputs, mixed_fp32):
    session = ort.InferenceSession(str(_fp16(ort_models)), providers=["CPUExecutionProvider"])
    assert {i.name: i.type for i in session.get_inputs()} == {n: "tensor(int64)" for n in ("input_ids", "attention_mask", "token_type_ids")}
    assert {o.name: o.type for o in session.get_outputs()} == {"logits": "tensor(float)", "pooled": "tensor(float)"}
    # fp16 inside: the weights are half the size of the fp32 export's
    fp32_size = (ort_models / "triton" / MODEL_NAME / "1" / "model.onnx").stat().st_size
    assert _fp16(ort_models).stat().st_size < 0.6 * fp32_size
    scores = LocalScorer(_fp16(ort_models), pad_id=0, buckets=FIXED, threads=2).score_sync(mixed_inputs, want_pooled=True)
    assert 0 < np.abs(scores.logits - mixed_fp32.logits).max() < 0.02  # fp16 rounding, not another model
    assert np.abs(scores.pooled - mixed_fp32.pooled).max() < 0.02
    entry = json.loads((ort_models / "entry.json").read_text())
    assert entry["runtime"] == "onnxruntime" and entry["device"] == "cuda" and entry["precision"] == "fp16"
    assert 0 < entry["max_abs_diff_vs_fp32"] < ort_cuda.FP16_ATOL and entry["pairs"] == 16
    version = _fp16(ort_models).parent
    assert json.loads((version / "runtime.json").read_text()) == ort_cuda.RUNTIME
    assert (version / "model.py").is_file() and (version / "grouping.py").is_file()
    assert (version.parent / "config.pbtxt").read_text().count('backend: "python"') == 1


def test_a_graph_that_strays_from_fp32_is_not_served(ort_models, prepared_models, tmp_path, monkeypatch):
    out = tmp_path / "m"
    for name in ("gateway", "triton"):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).symlink_to((prepared_models / name).resolve())
    manifest = json.loads((prepared_models / "gateway" / "manifest.json").read_text())
    monkeypatch.setattr(ort_cuda, "FP16_ATOL", 1e-6)
    with pytest.raises(ValueError, match="differs from fp32"):
        ort_cuda.write_ort_cuda_repository(out, manifest["cross_encoder"], ort_cuda.sample_rows(out, DATASETS))
    assert not (out / ort_cuda.REPOSITORY / MODEL_NAME / "1" / "model.onnx").exists()


def test_the_provider_choice():
    assert cuda_providers(["AzureExecutionProvider", "CPUExecutionProvider"]) is None
    providers = cuda_providers(["CUDAExecutionProvider", "CPUExecutionProvider"], device_id=1)
    assert providers[0][0] == CUDA and providers[0][1]["device_id"] == 1
    assert providers[-1] == "CPUExecutionProvider"  # what CUDA lacks runs on the CPU
    assert Settings(model_dir=Path("m")).embedded_repository("cuda", "onnxruntime") == Path("m/triton-embedded-cuda-ort")
    assert Settings(model_dir=Path("m")).embedded_repository("cuda") == Path("m/triton-embedded-cuda")
    assert Settings(model_dir=Path("m"), embedded_device="cuda", embedded_cuda_runtime="onnxruntime").embedded_repository() == Path("m/triton-embedded-cuda-ort")


def test_runs_through_io_binding_give_the_scores_of_session_run(prepared_models, mixed_inputs, mixed_fp32):
    onnx = prepared_models / "triton" / MODEL_NAME / "1" / "model.onnx"
    scorer = LocalScorer(onnx, pad_id=0, buckets=FIXED, threads=2)
    assert scorer.bound_device is None  # a CPU session runs session.run
    scorer.bound_device = "cpu"  # the GPU's code path, bound to host memory
    bound = scorer.score_sync(mixed_inputs, want_pooled=True)
    np.testing.assert_allclose(bound.logits, mixed_fp32.logits, atol=1e-5)
    np.testing.assert_allclose(bound.pooled, mixed_fp32.pooled, atol=1e-5)


@pytest.mark.skipif(HAS_CUDA, reason="this onnxruntime has CUDA: the fall back is not what runs")
def test_reranker_local_on_cuda_falls_back_to_the_cpu_variant_and_says_why(ort_models, prepared_models, caplog, monkeypatch):
    query, docs = dl20_requests(DATASETS, 2)[1]
    with Reranker.local(prepared_models, threads=2) as cpu:
        expected = [(r.index, r.score) for r in cpu.rank(query, docs[:10], strategy="maxp").results]
        cpu_runtime = cpu.scorer.runtime

    def fallback(model_dir, why):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="keyrank.reranker"):
            with Reranker.local(model_dir, threads=2, device="cuda") as reranker:
                assert reranker.scorer.runtime == cpu_runtime and reranker.scorer.bound_device is None
                assert [(r.index, r.score) for r in reranker.rank(query, docs[:10], strategy="maxp").results] == expected
        assert any(why in m and "scoring on the CPU instead" in m for m in caplog.messages), caplog.messages

    fallback(prepared_models, "`keyrank prepare --device cuda` writes it")  # no fp16 graph
    fallback(ort_models, "this onnxruntime has no CUDA provider")
    # onnxruntime-gpu on a machine without a GPU: the provider is listed, and does not start
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    fallback(ort_models, "CUDA provider did not start")
    with pytest.raises(ValueError, match="device must be"):
        Reranker.local(prepared_models, device="gpu")


@pytest.mark.triton
def test_embedded_triton_serves_the_fp16_graph_and_runs_it_on_the_cpu_without_cuda(ort_models, mixed_inputs, mixed_fp32):
    settings = Settings(model_dir=ort_models, embedded_device="cuda", embedded_cuda_runtime="onnxruntime",
                        embedded_http_port=0, embedded_grpc_port=0, embedded_metrics_port=0)
    scores = embedded_scores(settings.embedded_repository(), settings, mixed_inputs)
    assert 0 < np.abs(scores.logits - mixed_fp32.logits).max() < 0.02  # the fp16 graph ran
    assert np.abs(scores.pooled - mixed_fp32.pooled).max() < 0.02


@pytest.mark.skipif(not HAS_CUDA, reason="needs onnxruntime-gpu and a CUDA device (run on the GPU machine)")
def test_on_cuda_the_fp16_graph_runs_on_the_gpu_within_fp16_tolerance(ort_models, mixed_inputs, mixed_fp32):
    with Reranker.local(ort_models, device="cuda") as reranker:
        assert reranker.scorer.bound_device == "cuda" and reranker.scorer.runtime["provider"] == CUDA
        scores = reranker.scorer.score_sync(mixed_inputs, want_pooled=True)
    assert np.abs(scores.logits - mixed_fp32.logits).max() < 0.05
    assert np.abs(scores.pooled - mixed_fp32.pooled).max() < 0.05


def test_the_gpu_benchmark_says_why_the_onnx_runtime_cuda_row_is_missing(ort_models, monkeypatch):
    from keyrank.bench.gpu import ort_cuda_saturation

    version = _fp16(ort_models).parent
    rows, reference = np.zeros((16, 512), np.int64), np.zeros((16, 1), np.float32)
    if not HAS_CUDA:
        assert "no CUDA provider" in ort_cuda_saturation(version, rows, reference, 1.0, 1.0)["skipped"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert "python -m keyrank.prepare.ort_cuda" in ort_cuda_saturation(ort_models / "nowhere", rows, reference, 1.0, 1.0)["skipped"]
    if not HAS_CUDA:
        assert "did not start" in ort_cuda_saturation(version, rows, reference, 1.0, 1.0)["skipped"]
