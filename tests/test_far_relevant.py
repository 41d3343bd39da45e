"""The reason keyrank exists: the answer sits ~1500 tokens into a document.

Built from real SQuAD 2.0 text: the relevant document opens with ~1500 tokens
of passages from unrelated articles, then holds the paragraph that answers the
question. The distractors open with other paragraphs of the question's own
article (on topic, without the answer). FirstP reads only the opening, so it
prefers the on-topic distractors; MaxP and KeyB2 find the answer.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from shared_data import DATASETS

pytestmark = pytest.mark.triton

N_QUESTIONS = 3
FILLER_TOKENS = 1500


def _far_relevant_cases(tokenizer, seed: int = 7):
    squad = json.loads((DATASETS / "squad2-dev-half" / "dev-v2.0.json").read_text())
    rnd = random.Random(seed)
    articles = [a for a in squad["data"] if len(a["paragraphs"]) >= 6]
    cases = []
    for article in rnd.sample(articles, N_QUESTIONS):
        others = [p["context"] for a in squad["data"] if a is not article for p in a["paragraphs"]]
        answer_index = rnd.randrange(len(article["paragraphs"]))
        paragraph = article["paragraphs"][answer_index]
        question = next(q["question"] for q in paragraph["qas"] if not q.get("is_impossible"))
        same_article = [p["context"] for i, p in enumerate(article["paragraphs"]) if i != answer_index]

        def fill(pool, tokens):
            parts, count = [], 0
            while count < tokens:
                text = rnd.choice(pool)
                parts.append(text)
                count += len(tokenizer.encode_documents([text])[0])
            return parts

        relevant = "\n".join(fill(others, FILLER_TOKENS) + [paragraph["context"]] + fill(others, 200))
        distractors = ["\n".join(rnd.sample(same_article, 2) + fill(others, FILLER_TOKENS)) for _ in range(4)]
        answer_start = relevant.index(paragraph["context"])
        cases.append((question, [relevant] + distractors, answer_start, answer_start + len(paragraph["context"])))
    return cases


@pytest.fixture(scope="module")
def cases(reranker):
    return _far_relevant_cases(reranker.tokenizer)


def test_the_answer_really_is_far_from_the_start(reranker, cases):
    for _, docs, start, _ in cases:
        assert len(reranker.tokenizer.encode_documents([docs[0][:start]])[0]) >= FILLER_TOKENS


@pytest.mark.parametrize("strategy,selector", [("maxp", None), ("keyb2", "bm25"), ("keyb2", "dense")])
def test_far_relevant_document_is_ranked_first_by_maxp_and_keyb2(reranker, cases, strategy, selector):
    for question, docs, start, end in cases:
        ranking = reranker.rank(question, docs, strategy=strategy, selector=selector)
        assert ranking.results[0].index == 0, (strategy, selector, question)
        # The evidence points into the answer paragraph, past the filler.
        evidence = ranking.results[0].evidence
        assert any(e.start < end and e.end > start for e in evidence)


def test_firstp_does_not_find_the_far_relevant_document(reranker, cases):
    for question, docs, _, _ in cases:
        ranking = reranker.rank(question, docs, strategy="firstp")
        assert ranking.results[0].index != 0, question
        assert ranking.results[0].evidence[0].start == 0


def test_keyb2_reads_one_sequence_per_document_where_maxp_reads_several(reranker, cases):
    question, docs, _, _ = cases[0]
    keyb2 = reranker.rank(question, docs, strategy="keyb2", selector="bm25")
    maxp = reranker.rank(question, docs, strategy="maxp")
    assert keyb2.usage.scored_sequences == len(docs)
    assert maxp.usage.scored_sequences >= 4 * len(docs)
    assert keyb2.usage.scored_tokens * 3 < maxp.usage.scored_tokens


@pytest.mark.parametrize("strategy,selector", [("firstp", None), ("maxp", None), ("keyb2", "bm25")])
def test_in_process_reranker_ranks_the_far_relevant_case_like_the_triton_path(reranker, prepared_models, cases, strategy, selector):
    """``Reranker.local`` (ONNX Runtime, no Triton) gives the Triton path's order and scores."""
    from keyrank.reranker import Reranker

    local = Reranker.local(prepared_models)
    for question, docs, _, _ in cases[:1]:  # one case: maxp scores ~100 windows twice on 2 CPU cores
        remote = reranker.rank(question, docs, strategy=strategy, selector=selector).results
        here = local.rank(question, docs, strategy=strategy, selector=selector).results
        assert [r.index for r in here] == [r.index for r in remote]
        np.testing.assert_allclose([r.score for r in here], [r.score for r in remote], atol=1e-4)
