"""Adding a way of reading documents or a block selector is one class and one registry row (docs/ARCHITECTURE.md,
"Where a change goes"): both are added here, from outside the package, and served by the real pipeline, admission
estimate and fold without touching any of them.

The scorer is a tiny stand-in the test builds: a sequence's logit is its length, so what was read can be checked."""

from __future__ import annotations

import numpy as np
import pytest
from keyrank import select, strategies
from keyrank.admission import CHARS_PER_TOKEN, estimate_sequences
from keyrank.config import Settings
from keyrank.reranker import Reranker
from keyrank.resolved import RerankOptions
from keyrank.scoring import ModelInputs, Scores
from keyrank.select import SelectorSpec
from keyrank.strategies import StrategySpec
from keyrank.strategies.cuts import DocumentCut
from keyrank.strategies.passage import Passage


class LengthScorer:
    """Scorer: logit = sequence length; remembers what it was sent."""

    def __init__(self) -> None:
        self.seen: list[ModelInputs] = []

    async def score(self, inputs: ModelInputs, *, want_pooled: bool, deadline: float) -> Scores:
        self.seen.append(inputs)
        return Scores(np.asarray([len(ids) for ids in inputs.ids], np.float32), None)

    async def ready(self, timeout: float) -> bool:
        return True

    async def close(self) -> None:
        pass


class TailCut(DocumentCut):
    """LastP: the last document tokens that fit (what a reader of conclusions would pick)."""

    name = "tail"

    def segment(self, docs, budget, max_windows, ctx):
        return []

    def assemble(self, docs, pieces, block_scores, budget, settings, selector):
        return [Passage(i, np.array([max(0, len(d) - budget)]), np.array([len(d)]), np.zeros(1, np.int64))
                for i, d in enumerate(docs)]

    def sequences(self, tokens, window, settings, max_windows, selector):
        return float(len(tokens))


class RichestBlocks:
    """A selector that likes varied blocks: a block's score is how many distinct tokens it holds."""

    def __init__(self, context: select.SelectorContext):
        self.built_with = context

    def score(self, query_text, query, docs, pieces):
        return [np.array([len(np.unique(d.ids[a:b])) for a, b in zip(sp.starts, sp.ends)], np.float64)
                for d, sp in zip(docs, pieces)]


def build(context: select.SelectorContext) -> RichestBlocks:
    return RichestBlocks(context)


@pytest.fixture
def reranker(prepared_models):
    settings = Settings(model_dir=prepared_models, max_sequence_length=64, query_max_tokens=8, keyb2_budget_tokens=40,
                        block_max_tokens=12)
    return Reranker(settings, scorer=LengthScorer())


def test_a_new_cut_is_one_class_and_one_strategy_row(reranker, monkeypatch):
    monkeypatch.setitem(strategies.REGISTRY, "lastp", StrategySpec("lastp", TailCut(), "single", summary="the last tokens"))
    doc = " ".join(f"sentence {i} of the long report." for i in range(40))
    ranking = reranker.rank("what does the report conclude", [doc], strategy="lastp")
    (result,) = ranking.results
    assert ranking.strategy == "lastp"
    assert result.evidence[-1].end == len(doc)  # it read the end of the document ...
    assert result.evidence[0].start > len(doc) // 2  # ... and not its start
    assert result.truncated and result.read_tokens < result.document_tokens
    resolved = reranker.pipeline.resolve(RerankOptions(strategy="lastp"))
    assert estimate_sequences(resolved, "q", [doc, "x" * int(3000 * CHARS_PER_TOKEN)]) == 2  # its own cost rule


def test_a_new_selector_is_one_module_and_one_selector_row(reranker, monkeypatch):
    monkeypatch.setitem(select.REGISTRY, "richest", SelectorSpec(
        "richest", "gateway", __name__, ratio_scale=False, bi_encoder=False, sequences_per_block=0.0, summary="varied blocks"))
    filler = "Ok. " * 60
    rich = "seven quick zebras jump over lazy brown dogs"
    doc = f"{filler}{rich}. {filler}"
    ranking = reranker.rank("anything", [doc], strategy="keyb2", selector="richest")
    assert ranking.selector == "richest"
    (result,) = ranking.results
    assert result.truncated  # 40 of ~250 tokens read ...
    assert "zebras jump" in " ".join(doc[e.start:e.end] for e in result.evidence)  # ... around the varied sentence
    built = reranker.pipeline.block_selector("richest")
    assert built is reranker.pipeline.block_selector("richest")  # built once per pipeline, kept
    assert built.built_with.settings is reranker.settings


def test_the_hybrid_selector_shares_the_pipelines_bm25_selector(prepared_models):
    pipeline = Reranker(Settings(model_dir=prepared_models), scorer=LengthScorer()).pipeline
    hybrid = pipeline.block_selector("hybrid")
    assert hybrid.lexical is pipeline.block_selector("bm25") and hybrid.dense is pipeline.block_selector("dense")


def test_the_cross_selector_is_a_block_selector_whose_round_trip_the_reranker_awaits(reranker):
    # No branch on its name: the pipeline asks it like any selector and it answers the sequences the model scores
    # (each block alone with the query); the reranker awaits them on its scorer, the length of each here.
    from keyrank.select import ModelRoundTrip

    doc = " ".join(f"sentence {i} of the long report." for i in range(12))
    pipeline = reranker.pipeline
    assert pipeline.block_selector("cross") is pipeline.block_selector("cross")
    segmented = pipeline.start("what does the report conclude", [doc, "short."], RerankOptions(strategy="keyb2", selector="cross"))
    assert isinstance(segmented.round_trip, ModelRoundTrip) and segmented.awaits_model
    blocks = [len(p) for p in segmented.pieces]
    assert len(segmented.selector_inputs) == sum(blocks)
    reranker.scorer.seen.clear()
    ranking = reranker.rank("what does the report conclude", [doc, "short."], strategy="keyb2", selector="cross")
    assert [len(inputs) for inputs in reranker.scorer.seen] == [sum(blocks), 2]  # the round trip, then the plan
    assert ranking.usage.scored_sequences == sum(blocks) + 2
