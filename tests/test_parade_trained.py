"""PARADE-Attn / PARADE-Transformer (and PARADE-Attn over keyb2-blocks' inputs): the ONNX the gateway serves
scores like the PyTorch module, an untrained attention aggregator is parade-avg, and `keyrank finetune` trains
one (frozen encoder, resumable) that the reranker then serves as a strategy."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from keyrank.aggregate import ClassifierHead, aggregate
from keyrank.aggregators import KINDS, TrainedAggregator, pad_by_document
from keyrank.training import parade
from toy_judged import tiny_bert, toy_trec

HIDDEN = 16


def _pooled(windows: list[int], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """doc_of and pooled vectors for documents of the given window counts."""
    doc_of = np.repeat(np.arange(len(windows)), windows)
    return doc_of, np.random.default_rng(seed).standard_normal((doc_of.shape[0], HIDDEN)).astype(np.float32)


def _head() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.standard_normal((1, HIDDEN)).astype(np.float32), np.array([0.25], np.float32)


@pytest.mark.parametrize("kind", KINDS)
def test_served_aggregator_scores_equal_the_pytorch_module(kind, tmp_path):
    torch.manual_seed(0)
    module = parade.build(kind, HIDDEN, *_head())
    with torch.no_grad():  # away from the start (zero attention, identity layers): every weight must count
        for p in module.parameters():
            p.add_(0.3 * torch.randn_like(p))
    parade.export(module, kind, tmp_path / f"{kind}.onnx")
    served = TrainedAggregator.load(tmp_path / f"{kind}.onnx")
    doc_of, pooled = _pooled([1, 4, 7, 2, 3])
    padded, mask = pad_by_document(doc_of, pooled)
    with torch.no_grad():
        expected = module.eval()(torch.from_numpy(padded), torch.from_numpy(mask)).numpy()
    np.testing.assert_allclose(served(doc_of, pooled), expected, atol=1e-5)
    # As the reranker calls it: aggregate() with the 'trained' method.
    folded = aggregate("trained", doc_of, np.zeros(doc_of.shape[0]), pooled, trained=served)
    np.testing.assert_allclose(folded.scores, expected, atol=1e-5)
    assert served.meta["kind"] == kind
    # A document's score depends on its own windows only (padding and neighbours are masked out).
    alone = served(np.zeros(4, np.int64), pooled[doc_of == 1])
    np.testing.assert_allclose(alone, expected[1:2], atol=1e-5)


def test_untrained_attention_aggregator_is_parade_avg(tmp_path):
    weight, bias = _head()
    parade.export(parade.build("parade-attn", HIDDEN, weight, bias), "parade-attn", tmp_path / "parade-attn.onnx")
    served = TrainedAggregator.load(tmp_path / "parade-attn.onnx")
    doc_of, pooled = _pooled([3, 1, 6])
    head = ClassifierHead(weight.astype(np.float64), bias.astype(np.float64))
    parade_avg = aggregate("parade-avg", doc_of, np.zeros(doc_of.shape[0]), pooled, head).scores
    parade_max = aggregate("parade-max", doc_of, np.zeros(doc_of.shape[0]), pooled, head).scores
    np.testing.assert_allclose(served(doc_of, pooled), parade_avg, atol=1e-5)
    assert not np.allclose(parade_avg, parade_max, atol=1e-3)  # the comparison can tell avg from max


ATTENTION = {"parade-attn": "parade-avg", "keyb2-blocks-attn": "keyb2-blocks"}
"""Each attention strategy and the untrained row that plans the same inputs."""


@pytest.fixture(scope="module", params=sorted(ATTENTION))
def parade_run(request, tmp_path_factory):
    """A frozen-encoder attention run on the toy data (over the windows, or over keyb2-blocks' inputs), whole,
    and the same run stopped and resumed."""
    from keyrank.training import finetune
    from keyrank.training.recipe import TrecFiles

    kind = request.param
    root = tmp_path_factory.mktemp(kind)
    model, trec = tiny_bert(root / "tiny-bert"), TrecFiles(*toy_trec(root))
    common = {"model": str(model), "strategy": kind, "trec": trec, "epochs": 2, "groups_per_step": 2,
              "aggregator_lr": 1e-2, "seed": 0, "progress": False, "threads": 2, "dev_max_queries": None}
    whole = finetune(out=root / "whole", **common)
    stopped = finetune(out=root / "resumed", stop_after_steps=3, **common)
    resumed = finetune(out=root / "resumed", **common)
    return kind, whole, stopped, resumed


def test_parade_training_resumes_to_the_same_aggregator(parade_run):
    kind, whole, stopped, resumed = parade_run
    assert whole.finished and not stopped.finished and resumed.finished
    assert whole.model_dir is None  # frozen encoder: only the aggregator is a deliverable
    a = torch.load(whole.out / f"{kind}.pt")
    b = torch.load(resumed.out / f"{kind}.pt")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6)
    assert [h["loss"] for h in whole.history] == pytest.approx([h["loss"] for h in resumed.history], abs=1e-6)
    assert not torch.allclose(a["attention.weight"], torch.zeros_like(a["attention.weight"]))  # it trained


def test_trained_aggregator_is_served_as_its_strategy(parade_run):
    from keyrank.reranker import Reranker
    from keyrank.training.cli import install_aggregator
    from keyrank.data.judged import from_trec

    kind, whole, _, _ = parade_run
    config = json.loads((whole.out / "training.json").read_text())["config"]
    base = whole.out / "base"
    install_aggregator(whole.aggregator, base)
    judged = from_trec(config["trec"]["qrels"], config["trec"]["docs"], config["trec"]["queries"])[0]
    with Reranker.local(base) as reranker:
        ranking = reranker.rank(judged.query, list(judged.texts), strategy=kind)
        plan = reranker.pipeline.plan(judged.query, list(judged.texts), _options(ATTENTION[kind]))
        pooled = reranker.scorer.score_sync(plan.inputs, want_pooled=True).pooled
    module = parade.build(kind, pooled.shape[1])
    module.load_state_dict(torch.load(whole.out / f"{kind}.pt"))
    padded, mask = pad_by_document(plan.doc_of, pooled)
    with torch.no_grad():
        expected = module.eval()(torch.from_numpy(padded), torch.from_numpy(mask)).numpy()
    served = {r.index: r.score for r in ranking.results}
    np.testing.assert_allclose([served[i] for i in range(len(judged.texts))], expected, atol=1e-4)


def _options(strategy: str):
    from keyrank.pipeline import RerankOptions

    return RerankOptions(strategy=strategy)
