"""keyb2-blocks' length calibration (``keyb2_blocks_length_bias``): each input's logit + b x ln(tokens / 128) before
log-sum-exp, the same in serving (Reranker.fold), in training (TrainingRun.document_scores) and in what finetune's
readers step chooses and writes into the serving file. On a tiny BERT built here."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from keyrank.aggregate import aggregate, length_calibrated
from keyrank.config import Settings, serving_defaults
from keyrank.pipeline import RerankOptions

QUERY = "where is the river gauge"
DOCUMENTS = [
    "the river gauge stands by the old mill. " * 3,
    "a short note about the weather and nothing else",
    ("filler text about markets and trade routes. " * 40) + "the river gauge reads high in spring. " * 2,
]


@pytest.fixture(scope="module")
def served(toy):
    from keyrank.prepare.export import prepare

    folder = toy["root"] / "served"
    prepare(str(toy["model"]), folder, bi_encoder=None, cpu_variant="fp32")
    return folder


def _lse_by_doc(values: np.ndarray, doc_of: np.ndarray, n_docs: int) -> np.ndarray:
    return np.array([np.logaddexp.reduce(values[doc_of == d]) for d in range(n_docs)])


@pytest.mark.parametrize("bias", [0.0, 0.5, -1.0])
def test_serving_folds_each_input_weighed_by_its_length(served, bias):
    from keyrank.reranker import Reranker

    with Reranker.local(settings=Settings(model_dir=served, keyb2_blocks_length_bias=bias)) as reranker:
        plan = reranker.pipeline.plan(QUERY, DOCUMENTS, RerankOptions(strategy="keyb2-blocks", selector="bm25"))
        lengths = np.array([len(ids) for ids in plan.inputs.ids], dtype=np.float64)
        assert len(set(lengths)) > 1 and max(np.bincount(plan.doc_of)) > 1  # inputs of several lengths, a document with several
        logits = np.linspace(-1.0, 2.0, len(lengths))
        results, _ = reranker.fold(plan, logits, None)
    want = _lse_by_doc(logits + bias * np.log(lengths / 128.0), plan.doc_of, len(DOCUMENTS))
    got = np.array([r.score for r in sorted(results, key=lambda r: r.index)])
    np.testing.assert_allclose(got, want, rtol=1e-9)
    if bias == 0.0:  # the default folds the logits themselves
        np.testing.assert_allclose(got, aggregate("lse", plan.doc_of, logits).scores, rtol=1e-12)


def test_length_calibrated_leaves_the_logits_alone_at_zero_and_shifts_by_the_log_length():
    logits = np.array([0.5, -0.25])
    assert length_calibrated(logits, [64, 256], 0.0) is logits
    np.testing.assert_allclose(length_calibrated(logits, [64, 256], 1.0), logits + np.log([0.5, 2.0]))


def test_training_folds_as_serving_does(toy, tmp_path):
    """The document scores training computes for keyb2-blocks with a bias are serving's fold of the same per-input
    relevance."""
    from keyrank.training import loop
    from keyrank.training.model import Batch
    from keyrank.training.planned import training_request
    from keyrank.training.recipe import FinetuneConfig, TrecFiles
    from keyrank.training.run import TrainingRun

    torch.manual_seed(0)
    config = FinetuneConfig(model=str(toy["model"]), out=tmp_path / "run", strategy="keyb2-blocks", selector="bm25",
                            trec=TrecFiles(*toy["trec"]), progress=False, threads=2, settings={"keyb2_blocks_length_bias": 0.5})
    run = TrainingRun(config)
    assert run.settings.keyb2_blocks_length_bias == 0.5
    train, _ = loop._plan(run, training_request(run.pipeline, "keyb2-blocks", "bm25"))
    run.build_modules()
    run.encoder.eval()
    planned = next(p for p in train if len(p.judged.doc_ids) > 1)
    docs = tuple(range(len(planned.judged.doc_ids)))
    inputs = planned.model_inputs(docs)
    with torch.no_grad():
        scores = run.document_scores([(planned, docs)]).numpy()
        relevance, _ = run.encoder(Batch.of(inputs, run.pad_id, run.device))
    lengths = np.array([len(ids) for ids in inputs.ids], dtype=np.float64)
    want = _lse_by_doc(relevance.numpy().astype(np.float64) + 0.5 * np.log(lengths / 128.0), planned.doc_of(docs), len(docs))
    np.testing.assert_allclose(scores, want, rtol=1e-5, atol=1e-5)


def test_a_serving_file_may_set_the_length_bias(tmp_path):
    gateway = tmp_path / "gateway"
    gateway.mkdir()
    (gateway / "serving.env").write_text("KEYRANK_DEFAULT_STRATEGY=keyb2-blocks\nKEYRANK_KEYB2_BLOCKS_LENGTH_BIAS=0.5\n")
    settings, taken = serving_defaults(Settings(model_dir=tmp_path))
    assert settings.keyb2_blocks_length_bias == 0.5 and taken["keyb2_blocks_length_bias"] == "0.5"
    # a KEYRANK_KEYB2_BLOCKS_LENGTH_BIAS of the environment wins
    assert serving_defaults(Settings(model_dir=tmp_path), {"keyb2_blocks_length_bias"})[0].keyb2_blocks_length_bias == 0.0


def test_the_readers_step_reads_keyb2_blocks_at_each_length_bias_and_serves_the_best(toy, tmp_path):
    from keyrank.prepare.export import CHECKPOINT_SERVING_FILE
    from keyrank.training import finetune
    from keyrank.training.readers import LENGTH_BIASES
    from keyrank.training.recipe import TrecFiles

    torch.set_num_threads(2)
    result = finetune(model=str(toy["model"]), out=tmp_path / "readers", strategy="keyb2-blocks", selector="bm25",
                      trec=TrecFiles(*toy["trec"]), epochs=1, lr=5e-3, groups_per_step=2, sequences_per_forward=8, seed=0,
                      progress=False, threads=2, dev_max_queries=None, readers=("keyb2-blocks", "firstp"))
    row = result.readers["readers"]["keyb2-blocks"]
    assert row["length_bias"] in LENGTH_BIASES
    logged = json.loads((result.out / "training.json").read_text())["readers"]["readers"]["keyb2-blocks"]
    assert logged["length_bias"] == row["length_bias"]
    assert result.readers["settings"]["keyb2_blocks_length_bias"] == row["length_bias"]
    written = (result.model_dir / CHECKPOINT_SERVING_FILE).read_text()
    assert f"KEYRANK_KEYB2_BLOCKS_LENGTH_BIAS={row['length_bias']}" in written
    # every bias was read, and the row kept is the best of them (a tie to the smallest bias)
    measured = {float(b): v for b, v in row["by_length_bias"].items()}
    assert set(LENGTH_BIASES) <= set(measured) and row["nDCG@10"] == max(measured.values())
    assert row["length_bias"] == min((b for b, v in measured.items() if v == row["nDCG@10"]), key=abs)
