"""CPU variants of the cross-encoder: the fused default both CPU paths load, the quality gate
that refuses a variant with its numbers, and a failed `keyrank prepare` that leaves nothing half-made."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from keyrank.prepare import export, gate, variants
from keyrank.prepare.export import LOCK_NAME, prepare
from keyrank.prepare.variants import VariantRefused
from shared_data import CE_MODEL, linked_copy



def test_the_gate_holds_exact_variants_to_atol_and_int8_to_ranking_agreement():
    reference = [np.array([3.0, 1.0, -2.0, 0.5]), np.array([0.1, 0.2, 0.3])]
    same = gate.compare(reference, [r + 1e-6 for r in reference])
    assert (same["kendall_tau_mean"], same["top1_agreement"], same["queries"], same["pairs"]) == (1.0, 1.0, 2, 7)
    assert same["max_abs_diff"] == pytest.approx(1e-6, rel=1e-6)
    assert gate.verdict("fused", same, atol=1e-3) is None and gate.verdict("int8", same, atol=1e-3) is None
    # Same ranking, scores 0.01 apart: fine for int8, refused for fusion (which must compute the same function).
    shifted = gate.compare(reference, [r + 0.01 for r in reference])
    assert gate.verdict("int8", shifted, atol=1e-3) is None
    assert "atol" in gate.verdict("fused", shifted, atol=1e-3)
    # One swapped pair of four in the first query: tau 2/3 there, mean (2/3 + 1) / 2 < 0.95; top document kept.
    swapped = gate.compare(reference, [np.array([3.0, 0.4, -2.0, 0.5]), reference[1]])
    assert swapped["kendall_tau_mean"] == pytest.approx((2 / 3 + 1) / 2, abs=1e-4) and swapped["top1_agreement"] == 1.0
    assert "Kendall tau" in gate.verdict("int8", swapped, atol=1e-3)
    # A new top document in one query of two: refused even with a high tau elsewhere.
    long = np.arange(20.0)  # the two best of 20 swap: tau 1 - 2/190
    flipped = gate.compare([reference[0], long], [reference[0], np.r_[long[:18], 19.0, 18.0]])
    assert flipped["kendall_tau_mean"] >= 0.99 and flipped["top1_agreement"] == 0.5
    assert "top-1 agreement 50% < 100%" == gate.verdict("int8", flipped, atol=1e-3)
    # Near-ties swapped by differences within atol (a tiny model's scores, all within 1e-4): nothing moved.
    ties = gate.compare([np.array([0.10000, 0.10002, 0.10004])], [np.array([0.10004, 0.10002, 0.10000])])
    assert ties["kendall_tau_mean"] == -1.0 and gate.verdict("openvino-bf16", ties, atol=1e-3) is None
    assert "atol" in gate.verdict("fused", gate.compare(reference, [r + 0.01 for r in reference]), atol=1e-3)


def test_both_cpu_paths_load_the_fused_model_whose_scores_equal_fp32(prepared_models):
    manifest = json.loads((prepared_models / "gateway/manifest.json").read_text())
    cpu = manifest["cross_encoder"]["cpu"]
    assert cpu["variant"] == variants.AUTO_CHOICE == "fused" and "fallback" not in cpu
    # ONNX Runtime's optimizer fused what a BERT encoder has: 6 layers' attention, GELU, skip layer norms.
    assert cpu["fused_ops"]["Attention"] == 6 and cpu["fused_ops"]["SkipLayerNormalization"] == 12
    gate = cpu["gate"]
    assert gate["pairs_from"].startswith("../shared/datasets") and gate["pairs"] >= 100
    assert gate["kendall_tau_mean"] == 1.0 and gate["top1_agreement"] == 1.0 and gate["max_abs_diff"] <= 1e-4
    embedded = prepared_models / "triton-embedded/cross_encoder/1/model.onnx"
    fused = prepared_models / "cpu/cross_encoder/model.fused.onnx"
    assert embedded.read_bytes() == fused.read_bytes()
    assert "Attention" in {node.op_type for node in onnx.load(str(embedded), load_external_data=False).graph.node}

    from keyrank import Reranker

    reranker = Reranker.local(prepared_models)
    try:
        assert Path(reranker.scorer.session._model_path) == embedded
    finally:
        reranker.close()


def test_naive_int8_is_refused_with_its_numbers_and_nothing_of_it_is_served_or_left(prepared_models, tmp_path):
    out = linked_copy(prepared_models, tmp_path / "models")
    served = (out / "triton-embedded/cross_encoder/1/model.onnx").read_bytes()
    manifest_before = (out / "gateway/manifest.json").read_text()
    # The built-in pairs (no datasets): 5 queries x 5 real passages; naive int8 measured tau 0.88 on them.
    with pytest.raises(VariantRefused, match=r"'int8' refused by the quality gate: mean Kendall tau 0\.\d+ < 0\.95") as refused:
        prepare(str(CE_MODEL), out, cpu_variant="int8", datasets=None)
    report = refused.value.report
    assert report["pairs_from"].startswith("built-in") and report["pairs"] == 25 and report["kendall_tau_mean"] < 0.95
    assert (out / "triton-embedded/cross_encoder/1/model.onnx").read_bytes() == served
    assert (out / "gateway/manifest.json").read_text() == manifest_before
    assert list(out.rglob("*.tmp")) == [] and not (out / "cpu/cross_encoder/model.int8.onnx").exists()
    assert not (out / LOCK_NAME).exists()


def test_a_failed_prepare_into_a_new_folder_leaves_no_folder_and_no_lock(tmp_path, capsys):
    unsupported = tmp_path / "gpt2"
    unsupported.mkdir()
    (unsupported / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    out = tmp_path / "fresh" / "models"
    assert export.main(["--model", str(unsupported), "--out", str(out), "--no-bi-encoder"]) == 1
    assert "gpt2" in capsys.readouterr().err
    assert not out.exists()


def test_a_successful_prepare_leaves_no_lock_file(prepared_models, tmp_path):
    out = linked_copy(prepared_models, tmp_path / "models")
    prepare(str(CE_MODEL), out)
    assert not (out / LOCK_NAME).exists()


@pytest.mark.parametrize("argv", [["--help"]])
def test_every_prepare_option_says_what_it_does_and_its_default(argv, capsys):
    with pytest.raises(SystemExit):
        export.main(argv)
    text = capsys.readouterr().out
    blocks = text.split("options:")[1].split("\n  --")[1:]
    assert len(blocks) >= 12
    for block in blocks:
        assert "(default:" in " ".join(block.split()), block.split()[0]


@pytest.mark.parametrize("family", ["roberta", "deberta-v2"])
def test_auto_serves_fused_where_it_passes_and_fp32_with_the_reason_elsewhere(family, tmp_path_factory, tmp_path, monkeypatch):
    from families import family_checkpoint
    from keyrank.scoring import openvino

    # Without OpenVINO (auto's choices with it, openvino-bf16 and openvino, are tests/test_openvino.py's).
    monkeypatch.setattr(openvino, "available", lambda: False)
    assert variants.auto_candidates(family) == (["fused"] if family == "roberta" else [])
    manifest = prepare(str(family_checkpoint(family, tmp_path_factory)), tmp_path / "models", bi_encoder=None, atol=1e-4)
    cpu = manifest["cross_encoder"]["cpu"]
    served = (tmp_path / "models/triton-embedded/cross_encoder/1/model.onnx").read_bytes()
    if family in variants.FUSION_FAMILIES and "fallback" not in cpu:
        assert cpu["variant"] == "fused" and cpu["gate"]["max_abs_diff"] <= 1e-4
        assert served == (tmp_path / "models/cpu/cross_encoder/model.fused.onnx").read_bytes()
    else:
        assert cpu["variant"] == "fp32" and cpu["fallback"]
        assert served == (tmp_path / "models/triton/cross_encoder/1/model.onnx").read_bytes()
    if family == "deberta-v2":
        assert cpu["fallback"] == "no fusion for family 'deberta'"  # the manifest's family name
