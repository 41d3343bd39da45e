"""The calibrated int8 CPU variant (openvino-int8): it calibrates on training pairs only (never the
gate's, the dev meetings, the held-back DL20 topics, nor a validation split), it is built only where
it can be, `auto` says why it does not serve it, and (slow) `keyrank prepare` builds, gates and serves it."""

from __future__ import annotations

import json

import pytest
from keyrank.prepare import gate, int8, variants
from keyrank.prepare.gate import MIN_KENDALL_TAU
from keyrank.scoring import openvino
from shared_data import CE_MODEL, DATASETS, linked_copy


def _tokenizer(models):
    from keyrank.prepare.cross_encoder import serving_tokenizer
    from keyrank.template import InputTemplate

    template = InputTemplate.from_json(json.loads((models / "gateway/manifest.json").read_text())["cross_encoder"]["template"])
    return serving_tokenizer(models / "gateway/tokenizer.json", template), template


@pytest.mark.skipif(not (DATASETS / "qmsum" / "train").is_dir(), reason="judged data not found")
def test_calibration_reads_training_pairs_and_never_the_gates_dev_or_held_back_ones(prepared_models):
    from keyrank.data.splits import dl20_held_back, qmsum_dev_meeting

    tokenizer, template = _tokenizer(prepared_models)
    pairs, used = int8.calibration_pairs(DATASETS, tokenizer)
    assert len(used["qmsum_meetings"]) == int8.CALIBRATION_QMSUM_MEETINGS and used["dl20_qids"]
    assert len(pairs) >= 100
    train = sorted(p.stem for p in (DATASETS / "qmsum" / "train").glob("*.json"))
    gate_meetings = set(train[:3])  # gate.gate_groups reads the first three
    assert set(used["qmsum_meetings"]) <= set(train) - gate_meetings
    assert not any(qmsum_dev_meeting(m) for m in used["qmsum_meetings"])
    gate_queries = {str(r["hits"][0]["qid"]) for r in json.loads((DATASETS / "trec-dl20-passage/bm25_dl20.json").read_text())[:8]}
    assert not set(used["dl20_qids"]) & gate_queries
    assert not any(dl20_held_back(q) for q in used["dl20_qids"])
    # The gate's own pairs are none of these.
    groups, _ = gate.gate_groups(DATASETS, tokenizer, template)
    assert {g.name.split(":", 1)[1] for g in groups}.isdisjoint(set(used["qmsum_meetings"]) | set(used["dl20_qids"]))
    feeds, source = int8.calibration_feeds(DATASETS, tokenizer, template)
    assert sum(len(f["input_ids"]) for f in feeds) == len(pairs) and "training pairs" in source
    assert all(f["input_ids"].shape[1] <= 512 for f in feeds)


def test_int8_is_built_only_where_it_can_be_and_auto_says_why_it_does_not_serve_it(monkeypatch, tmp_path):
    monkeypatch.setattr(openvino, "available", lambda: False)
    assert variants.int8_possible(DATASETS) == "OpenVINO is not installed"
    # auto never serves it: the gate passes it, the full splits do not (docs/PERFORMANCE.md); the manifest says so
    monkeypatch.setattr(openvino, "available", lambda: True)
    monkeypatch.setattr(openvino, "bf16_supported", lambda: True)
    assert variants.auto_candidates("bert") == ["openvino-bf16", "openvino", "fused"]
    assert "nDCG@10" in variants.INT8_NOT_IN_AUTO and "--cpu-variant openvino-int8" in variants.INT8_NOT_IN_AUTO


def test_without_training_pairs_or_fast_int8_it_is_not_tried(monkeypatch, tmp_path):
    import importlib.util

    monkeypatch.setattr(openvino, "available", lambda: True)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "nncf" else real_find_spec(name, *a))
    monkeypatch.setattr(variants, "_cpu_capabilities", lambda: ["FP32", "BF16", "INT8"])
    assert variants.int8_possible(None) == "no training pairs to calibrate on under None (qmsum/train)"
    assert variants.int8_possible(tmp_path).startswith("no training pairs to calibrate on")
    assert variants.int8_possible(DATASETS) is None or not (DATASETS / "qmsum" / "train").is_dir()
    monkeypatch.setattr(variants, "_cpu_capabilities", lambda: ["FP32", "FP16"])
    assert variants.int8_possible(DATASETS) == "this CPU has no fast int8 (OpenVINO lists FP32, FP16)"


@pytest.mark.slow
@pytest.mark.skipif(variants.int8_possible(DATASETS) is not None, reason=str(variants.int8_possible(DATASETS)))
def test_prepare_builds_gates_and_serves_the_int8_graph_on_both_cpu_paths(prepared_models, tmp_path):
    """~2-4 min on 2 cores: NNCF's calibration and the gate."""
    from keyrank import Reranker
    from keyrank.prepare.export import prepare

    out = linked_copy(prepared_models, tmp_path / "models")
    cpu = prepare(str(CE_MODEL), out, cpu_variant="openvino-int8")["cross_encoder"]["cpu"]
    assert cpu["variant"] == "openvino-int8" and cpu["runtime"] == {"runtime": "openvino", "precision": "bf16"}
    gate = cpu["gate"]
    assert gate["kendall_tau_mean"] >= MIN_KENDALL_TAU and gate["top1_agreement"] == 1.0 and gate["max_abs_diff"] > 0
    assert cpu["qdq_ops"]["QuantizeLinear"] > 0 and "training pairs" in cpu["calibrated_on"]
    served = out / "triton-embedded/cross_encoder/1"
    assert (served / "model.onnx").read_bytes() == (out / "cpu/cross_encoder/model.openvino-int8.onnx").read_bytes()
    assert json.loads((served / "runtime.json").read_text()) == {"runtime": "openvino", "precision": "bf16"}
    ranking = Reranker.local(out).rank("who chaired the budget meeting", ["the mayor chaired the budget meeting", "a recipe for bread"])
    assert ranking.results[0].index == 0
