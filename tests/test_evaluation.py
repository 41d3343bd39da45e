"""The evaluation's constructions, metrics and report (no Triton needed).

The data are the real judged sets in ../shared/datasets; the tokenizer is the
real cross-encoder's. A final test, marked ``triton``, runs ``keyrank eval``
end to end through the real Reranker on an embedded Triton.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import ir_measures
import numpy as np
import pytest
from keyrank.data import farrelevant, qmsum, squad
from keyrank.data.queries import Candidate, EvalQuery, subsample
from keyrank.data.runs import QueryRun
from keyrank.evaluation import plots, report, tasks
from keyrank.evaluation.runner import systems
from keyrank.tokenize import TextTokenizer

REPO = Path(__file__).resolve().parents[1]
DATA = Path("/work/shared/datasets") if Path("/work/shared/datasets").exists() else REPO.parent / "shared" / "datasets"
CE_TOKENIZER = DATA.parent / "models" / "ce-minilm-l6" / "tokenizer.json"

pytestmark = pytest.mark.skipif(not DATA.exists() or not CE_TOKENIZER.exists(),
                                reason="needs ../shared/datasets and ../shared/models/ce-minilm-l6")


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return TextTokenizer.from_file(CE_TOKENIZER)


@pytest.fixture(scope="module")
def far(tokenizer) -> list[EvalQuery]:
    # A dozen topics keep the suite quick; the build itself re-checks every document of every topic.
    return farrelevant.build(DATA, tokenizer, seed=0, topics=set(farrelevant.usable_topics(DATA)[:12]))


def _target(q: EvalQuery) -> Candidate:
    return next(c for c in q.candidates if q.qrels.get(c.doc_id, 0) > 0)


# --- far-relevant DL20 --------------------------------------------------------------------------

def test_far_relevant_passages_start_at_the_requested_token_offset(far, tokenizer):
    assert {q.meta["offset_tokens"] for q in far} == set(farrelevant.OFFSETS)
    for q in far:
        for c in q.candidates:  # the relevant insert and every distractor's non-relevant insert
            start, end = q.meta["inserts"][c.doc_id]
            enc = tokenizer.encode_documents([c.text])[0]
            first = int(np.flatnonzero(enc.offsets[:, 0] == start)[0])
            assert first == q.meta["offset_tokens"], (q.qid, c.doc_id)
            passage = tokenizer.encode_documents([c.text[start:end]])[0]
            assert np.array_equal(enc.ids[first:first + len(passage)], passage.ids)
        assert _target(q).evidence == (tuple(q.meta["inserts"][_target(q).doc_id]),)
        assert q.bucket == str(q.meta["offset_tokens"])


def test_far_relevant_passage_appears_once_and_no_judged_relevant_text_elsewhere(far):
    topics = {t.qid: t for t in farrelevant.load_topics(DATA)}
    for q in far:
        topic = topics[q.meta["topic"]]
        target = _target(q)
        (start, end), = target.evidence
        relevant_text = target.text[start:end]
        assert dict(topic.relevant)[q.meta["relevant_docid"]] == relevant_text
        assert list(q.qrels.values()) == [1] and len(q.candidates) == farrelevant.DISTRACTORS + 1
        assert target.text.count(relevant_text) == 1
        filler = target.text[:start] + target.text[end:]
        for _, text in topic.relevant:  # no grade >= 2 passage in any filler or distractor
            assert text not in filler
            assert all(text not in c.text for c in q.candidates if c is not target)
        negatives = dict(topic.judged + topic.unjudged)
        for c in q.candidates:
            if c is not target:
                a, b = q.meta["inserts"][c.doc_id]
                assert c.text[a:b] in negatives.values()
                assert sum(c.text.count(t) for t in (c.text[a:b],)) == 1


def test_far_relevant_filler_is_off_topic_and_shared_by_no_two_candidates(far):
    topics = {t.qid: t for t in farrelevant.load_topics(DATA)}
    judged = {t for o in topics.values() for _, t in o.judged}
    # MS MARCO has passages that contain other passages; only the containing one counts as "used".
    whole = {t for t in judged if not any(t in o and o != t for o in judged)}
    for q in far[::9]:
        topic = topics[q.meta["topic"]]
        fillers = []
        for c in q.candidates:
            a, b = q.meta["inserts"][c.doc_id]
            fillers.append(c.text[:a] + " " + c.text[b:])
        for _, text in topic.relevant + topic.judged + topic.unjudged:  # none of the query's own hits
            assert not any(text in f for f in fillers)
        used = [sum(text in f for f in fillers) for text in whole - {t for _, t in topic.judged}]
        assert max(used) == 1 and sum(used) > 100  # ~45 whole passages per document, none in two


def test_far_relevant_same_topic_filler_is_built_from_the_querys_own_hits(tokenizer):
    topic = farrelevant.usable_topics(DATA)[0]
    (q,) = farrelevant.build(DATA, tokenizer, seed=0, offsets=(1024,), filler="same-topic", topics={topic})
    hits = next(t for t in farrelevant.load_topics(DATA) if t.qid == topic)
    own = [text for _, text in hits.judged + hits.unjudged]
    for c in q.candidates:
        assert sum(text in c.text for text in own) > 10


def _tiny_dl20(folder: Path) -> Path:
    """A judged set in DL20's layout with two topics: 101 has four judged non-relevant hits and an unjudged one,
    202 only two, so with two distractors its same-topic filler has nothing left to draw from."""
    hits = {
        101: [("where is the capital of france", None)],
        202: [("at what temperature does water boil", None)],
    }
    passages = {
        101: [("r101", 2, "Paris is the capital of France and its largest city."),
              ("n101a", 0, "Lyon is known for its food and its old town."),
              ("n101b", 0, "Marseille is a port on the Mediterranean coast."),
              ("n101c", 0, "The Loire valley holds many castles built by kings."),
              ("n101d", 0, "Bordeaux exports wine to many countries."),
              ("u101", None, "The Tour de France is a bicycle race held each summer.")],
        202: [("r202", 3, "Water boils at 100 degrees Celsius at sea level."),
              ("n202a", 0, "Ice floats because it is less dense than liquid water."),
              ("n202b", 0, "A kettle switches itself off with a bimetallic strip.")],
    }
    root = folder / "trec-dl20-passage"
    root.mkdir(parents=True)
    (root / "qrels.dl20-passage.txt").write_text("".join(
        f"{qid} 0 {docid} {grade}\n" for qid, ps in passages.items() for docid, grade, _ in ps if grade is not None))
    (root / "bm25_dl20.json").write_text(json.dumps([
        {"query": hits[qid][0][0], "hits": [{"content": text, "qid": qid, "docid": docid, "rank": rank + 1, "score": 10.0 - rank}
                                           for rank, (docid, _, text) in enumerate(ps)]}
        for qid, ps in passages.items()]))
    return folder


def test_far_relevant_same_topic_skips_and_names_a_topic_whose_non_relevant_hits_are_all_distractors(tokenizer, tmp_path):
    """A judged set where a topic's every non-relevant hit is a distractor: that topic is left out (the
    long documents and their ceiling alike) and said why; the others are built as before."""
    data = _tiny_dl20(tmp_path)
    skipped: dict[str, str] = {}
    far = farrelevant.build(data, tokenizer, offsets=(0, 512), distractors=2, filler="same-topic", skipped=skipped)
    assert skipped == {"202": farrelevant.NO_FILLER["same-topic"]}
    assert {q.meta["topic"] for q in far} == {"101"} and len(far) == 2
    assert all(len(q.candidates) == 3 for q in far)
    bare_skipped: dict[str, str] = {}
    bare = farrelevant.build_bare(data, tokenizer, distractors=2, filler="same-topic", skipped=bare_skipped)
    assert bare_skipped == skipped and {q.meta["topic"] for q in bare} == {"101"}
    # Other topics' filler: 202 draws from 101's judged passages, so nothing is left out.
    assert {q.meta["topic"] for q in farrelevant.build(data, tokenizer, offsets=(0,), distractors=2)} == {"101", "202"}

    # Through the task: listed per task (and per construction), in the report, and a set with nothing buildable
    # is one error that says why.
    left: dict[str, dict[str, str]] = {"farrel": {}, "farrel-bare": {}}
    built = {task: tasks.build(task, data, tokenizer, offsets=(0, 512), distractors=2, filler="same-topic",
                               dl20_topics="all", skipped=left[task], constructions=2)
             for task in left}
    assert left == {task: {"202#0": farrelevant.NO_FILLER["same-topic"], "202#1": farrelevant.NO_FILLER["same-topic"]}
                    for task in left}
    assert {q.meta["topic"] for qs in built.values() for q in qs} == {"101"}
    text = report.markdown(report.summarize("farrel", built["farrel"], {}, skipped=left["farrel"]))
    assert f"Left out (2): 202#0, 202#1: {farrelevant.NO_FILLER['same-topic']}." in text
    with pytest.raises(ValueError, match="no far-relevant topic could be built"):
        tasks.build("farrel", data, tokenizer, offsets=(0,), distractors=5, filler="same-topic", dl20_topics="all")


def test_far_relevant_offsets_differ_only_in_where_the_passages_sit(far):
    by_topic = defaultdict(list)
    for q in far:
        by_topic[q.meta["topic"]].append(q)
    for topic, group in by_topic.items():
        seen = set()
        for q in group:
            docs = []
            for c in q.candidates:
                a, b = q.meta["inserts"][c.doc_id]
                # A filler passage split at the offset gets a space inside; compare without whitespace.
                docs.append((c.text[a:b], "".join((c.text[:a] + c.text[b:]).split())))
            seen.add(tuple(sorted(docs)))
        assert len(seen) == 1, topic


def test_far_relevant_documents_are_the_same_length_so_length_gives_nothing_away(far, tokenizer):
    for q in far[::3]:
        lengths = [len(e) for e in tokenizer.encode_documents([c.text for c in q.candidates])]
        assert max(lengths) - min(lengths) <= 1  # a split word piece may re-tokenize one longer/shorter


def test_far_relevant_ceiling_ranks_the_same_inserts_bare(far, tokenizer):
    bare = {q.meta["topic"]: q for q in farrelevant.build_bare(DATA, tokenizer, seed=0)}
    for q in far:
        ceiling = bare[q.meta["topic"]]
        inserts = {c.text[slice(*q.meta["inserts"][c.doc_id])] for c in q.candidates}
        assert {c.text for c in ceiling.candidates} == inserts
        target = _target(ceiling)
        assert target.evidence == ((0, len(target.text)),)
        assert target.text == _target(q).text[slice(*_target(q).evidence[0])]


# --- determinism ------------------------------------------------------------------------------------

@pytest.mark.parametrize("task", ["qmsum", "farrel", "farrel-bare", "squad"])
def test_constructions_are_deterministic_for_a_seed(task, tokenizer):
    first = tasks.build(task, DATA, tokenizer, seed=7, max_queries=25)
    again = tasks.build(task, DATA, tokenizer, seed=7, max_queries=25)
    other = tasks.build(task, DATA, tokenizer, seed=8, max_queries=25)
    assert first == again
    assert first != other  # another seed draws other queries, inserts or candidates


def test_subsample_is_stratified_over_position_buckets():
    queries = [EvalQuery(f"q{i}", "x", [Candidate("d", "t")], {"d": 1}, bucket=b)
               for i, b in enumerate(["a"] * 50 + ["b"] * 5 + ["c"] * 45)]
    picked = subsample(queries, 15, seed=3)
    counts = {b: sum(q.bucket == b for q in picked) for b in "abc"}
    assert counts == {"a": 5, "b": 5, "c": 5}
    assert subsample(queries, 15, seed=3) == picked


def test_far_relevant_subsample_keeps_whole_topics_at_every_offset(tokenizer):
    far = tasks.build("farrel", DATA, tokenizer, seed=1, max_queries=20)
    bare = tasks.build("farrel-bare", DATA, tokenizer, seed=1, max_queries=20)
    topics = {q.meta["topic"] for q in far}
    assert len(topics) == 4 and len(far) == 20
    assert {q.meta["topic"] for q in bare} == topics


def test_far_relevant_constructions_draw_other_inserts_under_their_own_ids(tokenizer):
    one = tasks.build("farrel", DATA, tokenizer, seed=1, max_queries=10)
    two = tasks.build("farrel", DATA, tokenizer, seed=1, max_queries=10, constructions=2)
    assert [q.qid for q in one] == [q.qid.removesuffix("#1") for q in two[:10]] and "#" not in one[0].qid
    assert len(two) == 20 and len({q.qid for q in two}) == 20
    assert {q.meta["construction"] for q in two} == {1, 2}
    # the first construction is the single run's, the second draws other inserts for the same topics and offsets
    assert [q.candidates for q in two[:10]] == [q.candidates for q in one]
    assert {(q.meta["topic"], q.bucket) for q in two[10:]} == {(q.meta["topic"], q.bucket) for q in one}
    assert all(a.candidates != b.candidates for a, b in zip(two[:10], two[10:]))
    bare = tasks.build("farrel-bare", DATA, tokenizer, seed=1, max_queries=10, constructions=2)
    assert len(bare) == 4 and {q.qid.rpartition("#")[2] for q in bare} == {"1", "2"}
    with pytest.raises(ValueError, match="constructions must be >= 1"):
        tasks.build("farrel", DATA, tokenizer, seed=1, max_queries=10, constructions=0)


# --- QMSum ----------------------------------------------------------------------------------------------

def test_segments_are_balanced_and_never_split_a_turn():
    bounds = qmsum.segment_bounds(np.full(10, 100), 300)
    assert bounds == [(0, 3), (3, 7), (7, 10)]
    assert qmsum.segment_bounds(np.array([50, 60]), 1536) == [(0, 2)]


def test_qmsum_labels_follow_the_evidence_turns_on_a_known_meeting(tokenizer):
    turns = [{"speaker": f"S{i % 3}", "content": f"turn number {i} " + "word " * 40} for i in range(12)]
    meeting = {"meeting_transcripts": turns,
               "specific_query_list": [{"query": "what about turn 5", "relevant_text_span": [["5", "6"]]}]}
    (q,) = qmsum.meeting_queries("m", meeting, tokenizer, segment_tokens=150, seed=0)
    by_id = {c.doc_id: c for c in q.candidates}
    lines = {cid: c.text.split("\n") for cid, c in by_id.items()}
    holding = [cid for cid, ls in lines.items() if qmsum.turn_text(turns[5]) in ls or qmsum.turn_text(turns[6]) in ls]
    assert sorted(q.qrels) == sorted(holding)
    for cid, c in by_id.items():
        assert "".join(c.text[a:b] for a, b in c.evidence) .replace("\n", "") == "".join(
            qmsum.turn_text(turns[i]) for i in (5, 6) if qmsum.turn_text(turns[i]) in lines[cid])
    assert max(q.qrels.values()) == 2  # the segment with most of the evidence


def test_qmsum_val_labels_match_evidence_spans(tokenizer):
    queries = qmsum.build(DATA, tokenizer, split="val", seed=0)
    assert len(queries) > 200
    for path in sorted((DATA / "qmsum" / "val").glob("*.json"))[:6]:
        meeting = json.loads(path.read_text())
        turns = [qmsum.turn_text(t) for t in meeting["meeting_transcripts"]]
        for n, item in enumerate(meeting["specific_query_list"]):
            q = next(q for q in queries if q.qid == f"{path.stem}/{n}")
            evidence = qmsum.evidence_turns(item["relevant_text_span"], len(turns))
            # Segments in document order rebuild the transcript exactly.
            ordered = sorted(q.candidates, key=lambda c: c.doc_id)
            assert "\n".join(c.text for c in ordered) == "\n".join(turns)
            turn = 0
            for c in ordered:
                pos, inside = 0, []
                while pos < len(c.text):  # walk the segment turn by turn (lines may repeat, indices do not)
                    assert c.text.startswith(turns[turn], pos)
                    if turn in evidence:
                        inside.append((pos, pos + len(turns[turn])))
                    pos += len(turns[turn]) + 1
                    turn += 1
                assert (q.qrels.get(c.doc_id, 0) > 0) == bool(inside), (q.qid, c.doc_id)
                covered = {i for a, b in c.evidence for i in range(a, b) if c.text[i] != "\n"}
                assert covered == {i for a, b in inside for i in range(a, b)}
            assert turn == len(turns)


# --- SQuAD and buckets ----------------------------------------------------------------------------------

@pytest.mark.parametrize("start,bucket", [(0, "0-100"), (99, "0-100"), (100, "100-200"), (499, "400-500"),
                                          (500, "500+"), (4000, "500+")])
def test_answer_start_buckets(start, bucket):
    assert squad.answer_bucket(start) == bucket


@pytest.mark.parametrize("offset,bucket", [(0, "0-512"), (511, "0-512"), (512, "512-1024"), (1024, "1024+")])
def test_qmsum_offset_buckets(offset, bucket):
    assert qmsum.offset_bucket(offset) == bucket


def test_squad_relevant_context_holds_the_answer_in_its_bucket():
    queries = squad.build(DATA, seed=0)
    assert len(queries) == 2910
    for q in queries[::37]:
        target = _target(q)
        (start, end), = target.evidence
        assert q.bucket == squad.answer_bucket(start) == squad.answer_bucket(q.meta["answer_start"])
        assert len(target.text) == q.meta["context_chars"] and end <= len(target.text)
        assert len(q.candidates) == len({c.doc_id for c in q.candidates}) > 1


def test_bucket_order_is_numeric():
    assert sorted(["500+", "100-200", "0-100", "bare"], key=report.bucket_order) == ["0-100", "100-200", "500+", "bare"]


def test_psi_is_one_minus_min_over_max():
    assert report.psi({"a": 0.5, "b": 0.25, "c": 0.4}) == pytest.approx(0.5)
    assert report.psi({"a": 0.7, "b": 0.7}) == 0.0
    assert report.psi({"a": 0.0, "b": 0.0}) == 0.0
    assert report.psi({"a": 0.3}) is None


def _grouped(value, topics: int = 30, constructions: int = 2) -> tuple[list[EvalQuery], dict]:
    """Far-relevant-shaped queries (topic x construction x offset) with nDCG@10 = value(topic, construction, offset)."""
    queries, values = [], {}
    for t in range(topics):
        for c in range(constructions):
            for b in ("0", "1024", "3072"):
                qid = f"t{t}@{b}#{c}"
                queries.append(EvalQuery(qid, "x", [Candidate("d", "t")], {"d": 1}, bucket=b,
                                         meta={"topic": f"t{t}", "construction": c}))
                values[qid] = {"nDCG@10": value(t, c, b)}
    return queries, values


def test_psi_noise_tells_a_position_effect_from_noise():
    rng = np.random.default_rng(5)
    noise = {(t, c, b): float(rng.random() < 0.7) for t in range(30) for c in range(2) for b in ("0", "1024", "3072")}
    blind = report.psi_uncertainty(*_grouped(lambda t, c, b: noise[t, c, b]), "nDCG@10")
    # a position-blind system still shows a PSI on 60 groups; it is inside what shuffling the buckets gives
    assert blind["groups"] == 60 and blind["topics"] == 30
    assert blind["interval"][0] <= blind["psi"] <= blind["interval"][1]
    assert blind["psi"] <= blind["blind_95"] and blind["p"] > 0.05
    # the same noise, plus a loss at the deepest offset: far above the blind level, p ~ 0
    shifted = report.psi_uncertainty(*_grouped(lambda t, c, b: noise[t, c, b] * (0.6 if b == "3072" else 1.0)), "nDCG@10")
    assert shifted["psi"] > shifted["blind_95"] and shifted["p"] < 0.01
    assert shifted["psi"] == pytest.approx(report.psi({b: np.mean([noise[k] * (0.6 if b == "3072" else 1.0)
                                                                   for k in noise if k[2] == b]) for b in ("0", "1024", "3072")}))
    # a system that scores every offset alike has PSI 0 and nothing to test
    flat = report.psi_uncertainty(*_grouped(lambda t, c, b: 0.5 + 0.01 * t), "nDCG@10")
    assert flat["psi"] == 0.0 and flat["interval"] == [0.0, 0.0] and flat["p"] == 1.0
    # not grouped by topic (QMSum, SQuAD), or a group missing a bucket: no test
    queries, values = _grouped(lambda t, c, b: 1.0)
    assert report.psi_uncertainty(queries[:-1], values, "nDCG@10") is None
    assert report.psi_uncertainty(_tiny()[0], {"q1": {"nDCG@10": 1}, "q2": {"nDCG@10": 1}, "q3": {"nDCG@10": 1}}, "nDCG@10") is None


# --- metrics plumbing ------------------------------------------------------------------------------------

def _tiny() -> tuple[list[EvalQuery], list[QueryRun]]:
    queries = [
        EvalQuery("q1", "x", [Candidate("a", "aaaa bbbb", ((0, 4),)), Candidate("b", "b"), Candidate("c", "c")],
                  {"a": 1}, bucket="0-512"),
        EvalQuery("q2", "y", [Candidate("a", "a"), Candidate("b", "0123456789", ((2, 6),)), Candidate("c", "c")],
                  {"b": 2}, bucket="512-1024"),
        EvalQuery("q3", "z", [Candidate("a", "a", ((0, 1),)), Candidate("b", "b")], {"a": 1}, bucket="512-1024"),
    ]
    runs = [
        QueryRun("q1", "s", scores={"a": 0.5, "b": 0.9, "c": 0.1}, evidence={"a": [(0, 2, 0)], "b": [(0, 1, 0)]},
                 scored_sequences=3, scored_tokens=300, timings_ms={"infer": 2.0, "total": 3.0}, wall_ms=4.0),
        QueryRun("q2", "s", scores={"a": 0.1, "b": 0.9, "c": 0.5}, evidence={"b": [(4, 9, 1)]},
                 scored_sequences=3, scored_tokens=100, timings_ms={"infer": 4.0, "total": 5.0}, wall_ms=6.0),
        QueryRun("q3", "s", error="ScoringUnavailable: down"),
    ]
    return queries, runs


def test_metrics_match_ir_measures_on_a_hand_built_run():
    queries, runs = _tiny()
    values = report.per_query(queries, runs)
    # q1: relevant at rank 2 -> RR 1/2, nDCG 1/log2(3); q2: rank 1 -> 1; q3 failed -> 0.
    assert values["q1"]["RR@10"] == pytest.approx(0.5)
    assert values["q1"]["nDCG@10"] == pytest.approx(1 / np.log2(3))
    assert values["q2"]["nDCG@10"] == pytest.approx(1.0) and values["q3"]["nDCG@10"] == 0.0
    direct = ir_measures.calc_aggregate([ir_measures.parse_measure("nDCG@10")],
                                        {q.qid: q.qrels for q in queries[:2]},
                                        {r.qid: r.scores for r in runs[:2]})
    assert np.mean([values["q1"]["nDCG@10"], values["q2"]["nDCG@10"]]) == pytest.approx(
        direct[ir_measures.parse_measure("nDCG@10")])

    summary = report.summarize_system(queries, runs)
    assert summary["metrics"]["RR@10"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert summary["by_bucket"]["512-1024"]["RR@10"] == pytest.approx(0.5)
    assert summary["psi"]["RR@10"] == pytest.approx(0.0)
    assert summary["errors"] == 1
    assert summary["cost"]["scored_tokens"] == pytest.approx(200) and summary["cost"]["stage_ms"]["infer"] == 3.0
    assert summary["cost"]["sequences_per_document"] == pytest.approx(3 / (8 / 3))


def test_evidence_recall_is_the_share_of_evidence_characters_returned():
    queries, runs = _tiny()
    assert report.covered_share([(0, 4)], [(0, 2, 0)]) == pytest.approx(0.5)
    assert report.covered_share([(2, 6)], [(4, 9, 1)]) == pytest.approx(0.5)
    assert report.covered_share([(0, 4), (10, 14)], [(2, 12, None)]) == pytest.approx(0.5)
    stats = report.evidence_stats(queries, runs)
    # q1 a: 0.5, q2 b: 0.5, q3 a: nothing returned (failed) -> 0.
    assert stats == {"recall": pytest.approx(1 / 3), "hit": pytest.approx(2 / 3), "documents": 3}
    assert report.evidence_stats(queries, [QueryRun("q1", "s", scores={"a": 1.0})]) is None


def test_block_positions_histogram_counts_relative_starts():
    queries, runs = _tiny()
    pos = report.block_positions(queries, runs)
    # starts: q1/a 0/9 -> bin 0, q1/b 0/1 -> bin 0, q2/b 4/10 -> bin 8.
    assert sum(pos["all"]) == 3 and pos["all"][0] == 2 and pos["all"][8] == 1
    assert sum(pos["relevant"]) == 2 and pos["block_index"] == [2, 1]


def test_report_and_plots_are_written(tmp_path):
    queries, runs = _tiny()
    task_report = report.summarize("tiny", queries, {"keyb2-bm25": runs, "maxp": runs[:2]})
    assert 0 < task_report["random"]["metrics"]["nDCG@10"] < 1
    md = report.write(tmp_path, {"tiny": task_report}, {"tiny": {"keyb2-bm25": runs, "maxp": runs[:2]}})
    text = md.read_text()
    assert "| keyb2-bm25 |" in text and "random (expected)" in text and "0-512" in text
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["tiny"]["systems"]["maxp"]["metrics"]["RR@10"] == pytest.approx(0.5)
    figures = plots.write_all({"tiny": task_report}, tmp_path)
    assert [f.name for f in figures] == ["tiny_quality_vs_cost.png", "tiny_block_positions.png"]
    assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in figures)


def test_pareto_front_keeps_only_undominated_systems():
    front = plots.pareto_front([(100, 0.5), (200, 0.4), (300, 0.7), (50, 0.2), (300, 0.6)])
    assert front == [(50, 0.2), (100, 0.5), (300, 0.7)]


def test_keyb2_is_run_once_per_selector():
    names = [s.name for s in systems(["firstp", "keyb2", "maxp"], ["bm25", "cross"])]
    assert names == ["firstp", "keyb2-bm25", "keyb2-cross", "maxp"]


# --- end to end on the real service path -----------------------------------------------------------

@pytest.mark.triton
def test_keyrank_eval_runs_every_task_through_the_real_reranker(prepared_models, tmp_path, capsys):
    from keyrank.evaluation.cli import main

    model_dir = prepared_models
    out = tmp_path / "run"
    # Small enough for a CPU Triton: 1 DL20 topic x 2 offsets x 3 documents, 2 QMSum queries.
    args = ["--task", "qmsum", "farrel", "--strategies", "firstp", "maxp", "keyb2", "--selectors", "bm25",
            "--max-queries", "2", "--offsets", "0,1024", "--distractors", "2", "--data-dir", str(DATA),
            "--model-dir", str(model_dir), "--out", str(out), "--no-progress"]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results) == {"qmsum", "farrel", "farrel-bare"}
    from keyrank.prepare.variants import served_variant

    assert f"scored by the embedded Triton (CPU, its {served_variant(model_dir)} model)" in (out / "report.md").read_text()
    assert served_variant(model_dir) != "unknown"
    for task in results.values():
        for name in ("firstp", "maxp", "keyb2-bm25"):
            s = task["systems"][name]
            assert s["errors"] == 0, s["first_error"]
            assert s["cost"]["scored_sequences"] > 0 and 0 <= s["metrics"]["nDCG@10"] <= 1
    far = results["farrel"]["systems"]
    # keyb2 reads one sequence per document; maxp slides half-overlapping windows over ~1.4k tokens.
    assert far["keyb2-bm25"]["cost"]["sequences_per_document"] == pytest.approx(1.0)
    assert far["maxp"]["cost"]["sequences_per_document"] >= 4
    assert far["keyb2-bm25"]["evidence"]["documents"] == 2
    # PSI comes with its noise level: one topic, one construction, two offsets
    assert far["keyb2-bm25"]["psi_noise"]["groups"] == 1 and results["qmsum"]["systems"]["maxp"]["psi_noise"] is None
    assert "- keyb2-bm25: PSI(nDCG@10)" in (out / "report.md").read_text()
    runs = json.loads((out / "runs" / "farrel.json").read_text())["runs"]
    assert all(len(r["scores"]) == 3 for r in runs["maxp"])
    assert (out / "farrel_quality_vs_cost.png").exists() and (out / "farrel_block_positions.png").exists()

    # Each finished system was saved as it finished: the same command again scores nothing and reports the same.
    (out / "partial" / "qmsum.maxp.json").unlink()  # as if stopped while on qmsum's maxp
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "qmsum: keyb2-bm25 read back" in err and "qmsum: maxp read back" not in err
    assert json.loads((out / "results.json").read_text())["farrel"]["systems"]["maxp"]["metrics"] == far["maxp"]["metrics"]


def test_keyrank_eval_same_topic_filler_lists_a_topic_it_cannot_build_instead_of_stopping(prepared_models, tmp_path):
    """`keyrank eval --task farrel --filler same-topic` on a judged set with a topic whose non-relevant hits are
    all distractors: the run finishes, and its report and results name the topic left out."""
    from keyrank.evaluation.cli import main

    out = tmp_path / "run"
    args = ["--task", "farrel", "--filler", "same-topic", "--dl20-topics", "all", "--offsets", "0,512",
            "--distractors", "2", "--strategies", "firstp", "--scorer", "local", "--data-dir", str(_tiny_dl20(tmp_path)),
            "--model-dir", str(prepared_models), "--out", str(out), "--no-progress"]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    why = farrelevant.NO_FILLER["same-topic"]
    assert results["farrel"]["skipped"] == results["farrel-bare"]["skipped"] == {"202": why}
    assert results["farrel"]["queries"] == 2 and results["farrel-bare"]["queries"] == 1
    assert results["farrel"]["systems"]["firstp"]["errors"] == 0
    assert f"Left out (1): 202: {why}." in (out / "report.md").read_text()
