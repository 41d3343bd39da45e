"""`keyrank prepare`: the generated layout, ONNX equal to PyTorch on real text of mixed
lengths, the classifier head the gateway applies, Triton configs as Triton parses
them, any HF reranker head, and a second run that re-exports nothing."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from google.protobuf import text_format
from keyrank.prepare import cross_encoder as onnx_export
from keyrank.prepare import export
from keyrank.prepare.export import ExportMismatch, prepare
from keyrank.prepare.repositories import triton_config
from shared_data import CE_MODEL, DATASETS, linked_copy
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from tritonclient.grpc import model_config_pb2

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@pytest.fixture(scope="module")
def squad_pairs() -> list[tuple[str, str]]:
    """(question, context) from SQuAD 2.0 dev: contexts from ~100 to ~1,000+ characters, and two
    contexts joined to go past 512 tokens."""
    articles = json.loads((DATASETS / "squad2-dev-half" / "dev-v2.0.json").read_text())["data"]
    pairs = [(a["paragraphs"][0]["qas"][0]["question"], a["paragraphs"][0]["context"]) for a in articles[:6]]
    short = min((p for a in articles for p in a["paragraphs"]), key=lambda p: len(p["context"]))
    pairs.append((short["qas"][0]["question"], short["context"]))
    long_text = " ".join(p["context"] for p in articles[7]["paragraphs"][:6])
    pairs.append((articles[7]["paragraphs"][0]["qas"][0]["question"], long_text))
    return pairs


@pytest.fixture(scope="module")
def torch_reference():
    tokenizer = AutoTokenizer.from_pretrained(CE_MODEL)
    model = AutoModelForSequenceClassification.from_pretrained(CE_MODEL, dtype=torch.float32).eval()
    return tokenizer, model


def _encode(tokenizer, pairs):
    return tokenizer(
        [q for q, _ in pairs], [p for _, p in pairs],
        padding=True, truncation="only_second", max_length=512, return_tensors="np",
    )


def _ce_session(models: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(models / "triton" / "cross_encoder" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])


def test_prepare_writes_the_triton_repositories_and_gateway_assets(prepared_models):
    expected = [
        "triton/cross_encoder/config.pbtxt",
        "triton/cross_encoder/1/model.onnx",
        "triton-embedded/cross_encoder/config.pbtxt",
        "triton-embedded/cross_encoder/1/model.py",
        "triton-embedded/cross_encoder/1/grouping.py",
        "triton-embedded/cross_encoder/1/model.onnx",
        "gateway/manifest.json",
        "gateway/tokenizer.json",
        "gateway/classifier_head.npz",
        "gateway/bi_encoder/model.onnx",
        "gateway/bi_encoder/tokenizer.json",
    ]
    assert [p for p in expected if not (prepared_models / p).is_file()] == []
    production = prepared_models / "triton/cross_encoder/1/model.onnx"
    embedded = prepared_models / "triton-embedded/cross_encoder/1/model.onnx"
    # The embedded repository serves the gated CPU variant (fused by default; tests/test_variants.py), not the GPU's graph.
    assert embedded.read_bytes() == (prepared_models / "cpu/cross_encoder/model.fused.onnx").read_bytes() != production.read_bytes()
    package = Path(export.__file__).parent.parent / "modelserver" / "python_models"
    for name in ("model.py", "grouping.py"):  # the model and the grouping it shares with the GPU variant, as shipped
        assert (prepared_models / "triton-embedded/cross_encoder/1" / name).read_text() == (package / name).read_text()

    manifest = json.loads((prepared_models / "gateway/manifest.json").read_text())
    ce, bi = manifest["cross_encoder"], manifest["bi_encoder"]
    assert (ce["max_length"], ce["hidden_size"], ce["num_labels"], ce["triton_model"]) == (512, 384, 1, "cross_encoder")
    assert ce["head"] == "classifier" and ce["uses_token_type_ids"] is True
    assert 0 <= ce["onnx_max_abs_diff"] <= 1e-3 and 0 <= bi["onnx_max_abs_diff"] <= 1e-3
    assert bi["dim"] == 384


def test_onnx_matches_pytorch_on_real_pairs_of_mixed_lengths_in_one_padded_batch(prepared_models, squad_pairs, torch_reference):
    tokenizer, model = torch_reference
    enc = _encode(tokenizer, squad_pairs)
    lengths = enc["attention_mask"].sum(1)
    assert lengths.min() < 100 and lengths.max() == 512  # the batch really mixes short and truncated pairs
    inputs = {k: torch.from_numpy(v) for k, v in enc.items()}
    with torch.no_grad():
        reference = model(**inputs).logits.numpy()
        pooled_reference = model.bert(**inputs).pooler_output.numpy()
    logits, pooled = _ce_session(prepared_models).run(["logits", "pooled"], {k: enc[k] for k in INPUTS})
    assert logits.shape == (len(squad_pairs), 1) and pooled.shape == (len(squad_pairs), 384)
    assert np.abs(logits - reference).max() < 1e-3
    assert np.abs(pooled - pooled_reference).max() < 1e-3


def test_padding_to_a_longer_bucket_does_not_change_the_score(prepared_models, squad_pairs, torch_reference):
    tokenizer, _ = torch_reference
    session = _ce_session(prepared_models)
    alone = _encode(tokenizer, squad_pairs[:1])
    padded = tokenizer(squad_pairs[0][0], squad_pairs[0][1], padding="max_length", max_length=384, return_tensors="np")
    (a,) = session.run(["logits"], {k: alone[k] for k in INPUTS})
    (b,) = session.run(["logits"], {k: padded[k] for k in INPUTS})
    assert abs(float(a[0, 0]) - float(b[0, 0])) < 1e-4


def test_known_pair_scores_as_the_reference_checkpoint(prepared_models, torch_reference):
    tokenizer, _ = torch_reference
    enc = _encode(tokenizer, [("what is a cat", "a cat is an animal")])
    (logits,) = _ce_session(prepared_models).run(["logits"], {k: enc[k] for k in INPUTS})
    assert logits[0, 0] == pytest.approx(3.9349, abs=1e-3)


def test_classifier_head_applied_to_pooled_reproduces_the_logits(prepared_models, squad_pairs, torch_reference):
    tokenizer, _ = torch_reference
    enc = _encode(tokenizer, squad_pairs)
    logits, pooled = _ce_session(prepared_models).run(["logits", "pooled"], {k: enc[k] for k in INPUTS})
    with np.load(prepared_models / "gateway/classifier_head.npz") as head:
        weight, bias = head["weight"], head["bias"]
    assert weight.shape == (1, 384) and bias.shape == (1,)
    np.testing.assert_allclose(pooled @ weight.T + bias, logits, atol=1e-4)


def test_gateway_tokenizer_is_the_checkpoints_without_truncation_or_padding(prepared_models):
    from tokenizers import Tokenizer

    ours = Tokenizer.from_file(str(prepared_models / "gateway/tokenizer.json"))
    theirs = Tokenizer.from_file(str(CE_MODEL / "tokenizer.json"))
    assert ours.truncation is None and ours.padding is None
    text = "The Normans gave their name to Normandy, a region in France. " * 100
    assert ours.encode(text).ids == theirs.encode(text).ids and len(ours.encode(text).ids) > 512


def _parse(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def _assert_tensor_contract(config: model_config_pb2.ModelConfig) -> None:
    assert config.name == "cross_encoder" and config.max_batch_size == 64
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        (name, model_config_pb2.TYPE_INT64, [-1]) for name in INPUTS
    ]
    assert [(t.name, t.data_type, list(t.dims)) for t in config.output] == [
        ("logits", model_config_pb2.TYPE_FP32, [1]),
        ("pooled", model_config_pb2.TYPE_FP32, [384]),
    ]
    assert config.HasField("dynamic_batching")
    assert max(config.dynamic_batching.preferred_batch_size) <= config.max_batch_size
    assert 0 < config.dynamic_batching.max_queue_delay_microseconds <= 5000
    # One FIFO queue: with priority levels Triton's batcher left a request that came while the instance was
    # busy queued up to 500 ms (prepare/repositories.py); the gateway orders batches itself (scoring/fairness.py).
    assert (config.dynamic_batching.priority_levels, config.dynamic_batching.default_priority_level) == (0, 0)


def test_production_config_is_a_gpu_onnxruntime_model_with_dynamic_batching(prepared_models):
    config = _parse((prepared_models / "triton/cross_encoder/config.pbtxt").read_text())
    _assert_tensor_contract(config)
    assert config.backend == "onnxruntime"
    assert [g.kind for g in config.instance_group] == [model_config_pb2.ModelInstanceGroup.KIND_GPU]
    assert not config.optimization.execution_accelerators.gpu_execution_accelerator


def test_embedded_config_runs_the_python_backend_on_cpu(prepared_models):
    config = _parse((prepared_models / "triton-embedded/cross_encoder/config.pbtxt").read_text())
    _assert_tensor_contract(config)
    assert config.backend == "python"
    assert [(g.kind, g.count) for g in config.instance_group] == [(model_config_pb2.ModelInstanceGroup.KIND_CPU, 1)]
    assert config.parameters["intra_op_thread_count"].string_value == "0"


def test_tensorrt_fp16_adds_the_accelerator_with_a_profile_up_to_the_max_batch_and_length():
    text = triton_config(backend="onnxruntime", hidden_size=384, num_labels=1, max_batch_size=64, max_length=512, tensorrt_fp16=True)
    (accelerator,) = _parse(text).optimization.execution_accelerators.gpu_execution_accelerator
    assert accelerator.name == "tensorrt"
    assert accelerator.parameters["precision_mode"] == "FP16"
    assert "input_ids:64x512" in accelerator.parameters["trt_profile_max_shapes"]
    assert "token_type_ids:1x1" in accelerator.parameters["trt_profile_min_shapes"]



def test_second_prepare_reexports_nothing_and_takes_under_a_few_seconds(prepared_models, tmp_path):
    out = linked_copy(prepared_models, tmp_path / "models")
    onnx_files = [out / "triton/cross_encoder/1/model.onnx", out / "gateway/bi_encoder/model.onnx"]
    before = [f.stat().st_ino for f in onnx_files]
    started, cpu = time.perf_counter(), time.process_time()
    manifest = prepare(str(CE_MODEL), out, cpu_variant="fused")  # the arguments prepared_models was made with
    # This process's CPU time, not the wall clock alone: on a busy 2-core machine the wall clock of a few file
    # reads has run to 7 s, while an export and its gate cost a minute of CPU.
    assert time.process_time() - cpu < 5 and time.perf_counter() - started < 30
    assert [f.stat().st_ino for f in onnx_files] == before
    recorded = json.loads((prepared_models / "gateway/manifest.json").read_text())
    assert {k: {**v, "source": None} for k, v in manifest.items()} == {k: {**v, "source": None} for k, v in recorded.items()}


def test_changed_serving_options_rewrite_only_the_configs(prepared_models, tmp_path):
    out = linked_copy(prepared_models, tmp_path / "models")
    onnx = out / "triton/cross_encoder/1/model.onnx"
    inode = onnx.stat().st_ino
    prepare(str(CE_MODEL), out, tensorrt_fp16=True, embedded_instances=2, max_batch_size=32, cpu_variant="fused")
    assert onnx.stat().st_ino == inode
    production = _parse((out / "triton/cross_encoder/config.pbtxt").read_text())
    embedded = _parse((out / "triton-embedded/cross_encoder/config.pbtxt").read_text())
    assert production.optimization.execution_accelerators.gpu_execution_accelerator[0].name == "tensorrt"
    assert (production.max_batch_size, embedded.instance_group[0].count) == (32, 2)
    # The shared tree was not touched through the hard links.
    assert "tensorrt" not in (prepared_models / "triton/cross_encoder/config.pbtxt").read_text()


def test_no_bi_encoder_removes_it_and_says_so_in_the_manifest(prepared_models, tmp_path):
    out = linked_copy(prepared_models, tmp_path / "models")
    manifest = prepare(str(CE_MODEL), out, bi_encoder=None)
    assert manifest["bi_encoder"] is None
    assert not (out / "gateway/bi_encoder").exists()


def _tiny_checkpoint(tmp_path: Path, kind: str) -> Path:
    """A random tiny reranker of another architecture, with the real (BERT) tokenizer."""
    from transformers import (
        DistilBertConfig,
        DistilBertForSequenceClassification,
        RobertaConfig,
        RobertaForSequenceClassification,
    )

    torch.manual_seed(0)
    if kind == "roberta":  # head = classifier.dense -> tanh -> classifier.out_proj; one segment type
        model = RobertaForSequenceClassification(RobertaConfig(
            vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            num_labels=1, pad_token_id=0, max_position_embeddings=514, type_vocab_size=1,
        ))
    else:  # no token_type_ids at all
        model = DistilBertForSequenceClassification(DistilBertConfig(
            vocab_size=30522, dim=32, n_layers=2, n_heads=2, hidden_dim=64, num_labels=1,
        ))
    folder = tmp_path / kind
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(CE_MODEL).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("kind, head", [("roberta", "classifier.out_proj"), ("distilbert", "classifier")])
def test_other_architectures_export_with_pooled_as_the_final_linears_input(tmp_path, kind, head):
    checkpoint = _tiny_checkpoint(tmp_path, kind)
    manifest = prepare(str(checkpoint), tmp_path / "out", bi_encoder=None)
    ce = manifest["cross_encoder"]
    assert (ce["head"], ce["hidden_size"], ce["uses_token_type_ids"]) == (head, 32, False)

    session = _ce_session(tmp_path / "out")
    assert [i.name for i in session.get_inputs()] == list(INPUTS)  # the Triton contract holds for every model
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    enc = _encode(tokenizer, [("who was rollo", "Rollo led the Norse raiders. " * 20), ("cats", "no")])
    logits, pooled = session.run(["logits", "pooled"], {k: enc[k] for k in INPUTS})
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint).eval()
    with torch.no_grad():
        reference = model(input_ids=torch.from_numpy(enc["input_ids"]), attention_mask=torch.from_numpy(enc["attention_mask"])).logits
    np.testing.assert_allclose(logits, reference.numpy(), atol=1e-4)
    with np.load(tmp_path / "out/gateway/classifier_head.npz") as npz:
        np.testing.assert_allclose(pooled @ npz["weight"].T + npz["bias"], logits, atol=1e-5)
    # BERT-style segment ids (what the gateway sends) must not change a model that has none.
    flipped = {**{k: enc[k] for k in INPUTS}, "token_type_ids": np.ones_like(enc["token_type_ids"])}
    np.testing.assert_allclose(session.run(["logits"], flipped)[0], logits, atol=1e-6)


@pytest.mark.parametrize("model_type, positions, pad, tokenizer_limit, expected", [
    ("bert", 512, 0, 512, 512),
    ("xlm-roberta", 514, 1, int(1e30), 512),  # positions count from padding_idx + 1; no tokenizer limit
    ("xlm-roberta", 8194, 1, 8192, 8192),  # bge-reranker-v2-m3
    ("modernbert", 8192, 50283, 8192, 8192),  # gte-reranker-modernbert-base
    ("qwen3", 40960, 151643, 131072, 40960),  # Qwen3-Reranker: the tokenizer states more than the positions
    ("bert", 2048, 0, 512, 512),  # a tokenizer that reads less than the positions is believed
])
def test_the_models_own_length_comes_from_its_position_embeddings(model_type, positions, pad, tokenizer_limit, expected):
    from types import SimpleNamespace

    from keyrank.prepare.cross_encoder import _max_length

    config = SimpleNamespace(model_type=model_type, max_position_embeddings=positions, pad_token_id=pad)
    assert _max_length(SimpleNamespace(model_max_length=tokenizer_limit), config) == expected


def test_an_onnx_graph_off_by_more_than_atol_is_refused():
    reference = np.array([[3.9349], [-1.25]], dtype=np.float32)
    assert onnx_export.check_close("logits", reference, reference + 5e-4, atol=1e-3) == pytest.approx(5e-4, rel=1e-3)
    with pytest.raises(ExportMismatch, match="1.4"):
        onnx_export.check_close("logits", reference, reference + np.array([[0.0], [1.4]], dtype=np.float32), atol=1e-3)
    with pytest.raises(ExportMismatch):
        onnx_export.check_close("logits", reference, np.full_like(reference, np.nan), atol=1e-3)


def test_cli_reports_the_diffs_and_sizes(prepared_models, tmp_path, capsys):
    out = linked_copy(prepared_models, tmp_path / "models")
    assert export.main(["--model", str(CE_MODEL), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "cross_encoder:" in printed and "bi_encoder:" in printed and "MB" in printed


@pytest.mark.slow
def test_fresh_export_of_the_real_checkpoint_passes_its_own_check(tmp_path):
    manifest = prepare(str(CE_MODEL), tmp_path / "models", force=True)
    assert manifest["cross_encoder"]["onnx_max_abs_diff"] < 1e-3
    assert manifest["bi_encoder"]["onnx_max_abs_diff"] < 1e-3


@pytest.mark.triton
def test_embedded_model_merges_same_shape_requests_and_splits_the_answers_back(embedded_triton, prepared_models, squad_pairs, torch_reference):
    import tritonclient.grpc as grpcclient

    tokenizer, _ = torch_reference
    session = _ce_session(prepared_models)
    # Sixteen requests of 2 rows fired at once: the dynamic batcher hands model.py several at a time.
    requests = []
    for k in range(16):
        pairs = [squad_pairs[k % len(squad_pairs)], squad_pairs[(k + 3) % len(squad_pairs)]]
        width = 128 if k % 4 else 256  # two shapes in flight: only equal shapes may be merged
        enc = tokenizer([q for q, _ in pairs], [p for _, p in pairs], padding="max_length", truncation="only_second", max_length=width, return_tensors="np")
        requests.append({k: enc[k].astype(np.int64) for k in INPUTS})

    from keyrank.modelserver.embedded import GRPC_ADMIN_HEADER

    client = grpcclient.InferenceServerClient(embedded_triton.grpc_url)
    admin = {GRPC_ADMIN_HEADER: embedded_triton.admin_key}  # statistics are a restricted (admin) API
    before = client.get_inference_statistics("cross_encoder", headers=admin).model_stats[0]
    results: list = [None] * len(requests)
    done = []

    def callback(index):
        return lambda result, error: (results.__setitem__(index, error or result), done.append(index))

    for index, feeds in enumerate(requests):
        inputs = []
        for name in INPUTS:
            tensor = grpcclient.InferInput(name, list(feeds[name].shape), "INT64")
            tensor.set_data_from_numpy(feeds[name])
            inputs.append(tensor)
        outputs = [grpcclient.InferRequestedOutput(n) for n in ("logits", "pooled")]
        client.async_infer("cross_encoder", inputs, callback(index), outputs=outputs)
    deadline = time.monotonic() + 120
    while len(done) < len(requests) and time.monotonic() < deadline:
        time.sleep(0.05)
    after = client.get_inference_statistics("cross_encoder", headers=admin).model_stats[0]
    client.close()

    assert len(done) == len(requests)
    for feeds, result in zip(requests, results):
        assert not isinstance(result, Exception), result
        want_logits, want_pooled = session.run(["logits", "pooled"], feeds)
        assert result.as_numpy("logits").dtype == np.float32
        np.testing.assert_allclose(result.as_numpy("logits"), want_logits, atol=1e-4)
        np.testing.assert_allclose(result.as_numpy("pooled"), want_pooled, atol=1e-4)
    # 32 rows (16 requests of 2); the supervisor's probe inferences ([1, 8], every 2 s) may add a few.
    assert 32 <= after.inference_count - before.inference_count <= 32 + 10
    # The batcher did hand model.py several requests per execute(), so the merge-and-split path ran:
    # a batch of 4 or more rows can only be two or more of these 2-row requests merged (probes are 1 row).
    merged = {b.batch_size: b.compute_infer.count for b in after.batch_stats}
    merged_before = {b.batch_size: b.compute_infer.count for b in before.batch_stats}
    assert any(size >= 4 and count > merged_before.get(size, 0) for size, count in merged.items()), merged


def test_a_hub_id_is_fetched_from_the_hub_and_offline_fails_with_a_clear_message(tmp_path, monkeypatch, capsys):
    # No hub is reachable here: the id must reach the hub path and come back as a readable error.
    from keyrank.prepare.export import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["--model", "cross-encoder/ms-marco-MiniLM-L-6-v2", "--out", str(tmp_path / "m")]) == 1
    err = capsys.readouterr().err
    assert "cross-encoder/ms-marco-MiniLM-L-6-v2" in err and "Hugging Face hub" in err and "Traceback" not in err
