"""SQuAD far-relevant, built for training: a question's own context inserted deep into
other articles' text, among same-article distractors; training reads only the train half of the
articles, by a fixed hash of the title."""

from __future__ import annotations

import json

import pytest
from keyrank.data import squad
from keyrank.data.splits import squad_held_back
from keyrank.tokenize import TextTokenizer
from keyrank.training import splits
from shared_data import CE_MODEL, DATASETS

TOKENIZER = TextTokenizer.from_file(CE_MODEL / "tokenizer.json")
ARTICLES = [a["title"] for a in json.loads((DATASETS / "squad2-dev-half" / "dev-v2.0.json").read_text())["data"]]


def test_the_article_split_is_fixed_and_holds_back_seven_of_sixteen():
    held = sorted(t for t in ARTICLES if squad_held_back(t))
    assert held == ["French_and_Indian_War", "Huguenot", "Immune_system", "Imperialism", "Islamism", "Normans", "Warsaw"]
    assert splits.squad_articles(DATASETS, held_back=True) == set(held)
    assert splits.squad_articles(DATASETS, held_back=False) == set(ARTICLES) - set(held)


def test_each_ranking_holds_its_own_context_at_the_offset_among_same_article_distractors():
    data = json.loads((DATASETS / "squad2-dev-half" / "dev-v2.0.json").read_text())
    article = next(a for a in data["data"] if a["title"] == "Steam_engine")
    contexts = [p["context"] for p in article["paragraphs"]]
    built = squad.build_far(DATASETS, TOKENIZER, offsets=(0, 1024), articles={"Steam_engine"})
    assert len(built) == 2 * sum(any(not q.get("is_impossible") and q["answers"] for q in p["qas"]) for p in article["paragraphs"])
    for q in built[:10]:
        (target,) = q.qrels
        by_id = {c.doc_id: c for c in q.candidates}
        assert len(q.candidates) == 5
        lengths = [len(e) for e in TOKENIZER.encode_documents([c.text for c in q.candidates])]
        assert max(lengths) - min(lengths) <= 3  # one length (a cut filler passage may re-tokenize a piece apart)
        inserted = {d: by_id[d].text[a:b] for d, (a, b) in q.meta["inserts"].items()}
        assert inserted[target] == contexts[q.meta["context"]]
        assert {inserted[d] for d in inserted if d != target} == {contexts[i] for i in q.meta["negative_contexts"]}
        assert q.meta["context"] not in q.meta["negative_contexts"]
        head = TOKENIZER.encode_documents([by_id[target].text[: q.meta["inserts"][target][0]]])[0]
        assert len(head) == q.meta["offset_tokens"]


def test_training_reads_only_the_train_articles_grouped_by_context():
    train, dev = splits.build("squad-far", DATASETS, TOKENIZER, offsets=(0,))
    assert dev == [] and len(train) > 300
    articles = {q.group.removeprefix("squad-far:").split("#")[0] for q in train}
    assert articles == splits.squad_articles(DATASETS, held_back=False)
    assert all(q.trainable for q in train)


def test_an_unknown_training_task_names_the_known_ones():
    with pytest.raises(ValueError, match="squad-far"):
        splits.build("squad", DATASETS, TOKENIZER)
