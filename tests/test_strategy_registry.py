"""Each strategy's own cut and aggregation, pinned: swapping one row of the
registry for another's (sump -> max, avgp -> sliding, ...) fails here.

The scorer is a tiny model the test builds: a sequence's logit is the number of
times a marker token occurs in it, and its pooled vector is (markers, length),
so every document score below can be worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
from keyrank.aggregate import ClassifierHead
from keyrank.config import Settings
from keyrank.pipeline import RerankOptions
from keyrank.reranker import Reranker
from keyrank.scoring import ModelInputs, Scores
from keyrank.strategies import REGISTRY, STRATEGIES

MARKER = "zebra"


class MarkerCounter:
    """Scorer: logit = occurrences of the marker's id; pooled = [occurrences, sequence length]."""

    def __init__(self, marker_id: int):
        self.marker_id = marker_id
        self.seen: list[ModelInputs] = []

    async def score(self, inputs: ModelInputs, *, want_pooled: bool, deadline: float) -> Scores:
        self.seen.append(inputs)
        counts = np.asarray([(ids == self.marker_id).sum() for ids in inputs.ids], np.float32)
        lengths = np.asarray([len(ids) for ids in inputs.ids], np.float32)
        return Scores(counts, np.stack([counts, lengths], 1) if want_pooled else None)

    async def ready(self, timeout: float) -> bool:
        return True

    async def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def counting(prepared_models):
    settings = Settings(model_dir=prepared_models, max_sequence_length=64, query_max_tokens=8, keyb2_budget_tokens=48,
                        block_max_tokens=12)  # blocks = the sentences below
    reranker = Reranker(settings, scorer=MarkerCounter(0))
    (enc,) = reranker.tokenizer.encode_documents([MARKER])
    assert len(enc) == 1, "the marker must be one token"
    reranker.scorer.marker_id = int(enc.ids[0])
    reranker.head = ClassifierHead(np.array([[1.0, 0.0]]), np.array([0.0]))  # PARADE's head reads the marker count
    return reranker


def _doc(reranker, layout: list[int]) -> str:
    """Sentences of filler (9 tokens each); sentence i starts with ``layout[i]`` markers."""
    words = "the quiet river ran past an old mill"
    sentences = [" ".join([MARKER] * k + words.split()[k:]) + "." for k in layout]
    return " ".join(sentences)


def _score(reranker, strategy: str, doc: str) -> tuple[float, list[int]]:
    ranking = reranker.rank("where is the mill", [doc], strategy=strategy, selector="bm25" if strategy == "keyb2" else None)
    inputs = reranker.scorer.seen[-1]
    return ranking.results[0].score, [len(ids) for ids in inputs.ids]


def _marker_counts(reranker) -> list[int]:
    """Markers in each sequence the last request scored."""
    inputs = reranker.scorer.seen[-1]
    return [int((ids == reranker.scorer.marker_id).sum()) for ids in inputs.ids]


def test_every_registered_strategy_is_pinned_here():
    assert set(REGISTRY) == set(PINNED) | {"keyb2"}


def test_the_names_the_settings_type_are_the_registries_rows_in_order():
    # names.py is the leaf the settings read their Strategy and Selector types from, so that config.py needs
    # no registry; a row added to a registry without its name (or the other way round) fails here.
    from keyrank import names, select, strategies

    assert names.STRATEGIES == tuple(REGISTRY) == tuple(strategies.REGISTRY) and STRATEGIES is names.STRATEGIES
    assert names.SELECTORS == tuple(select.REGISTRY)
    assert all(spec.name == name for name, spec in REGISTRY.items())
    assert all(spec.name == name for name, spec in select.REGISTRY.items())


def test_firstp_reads_only_the_first_budget_tokens(counting):
    doc = _doc(counting, [0] * 12 + [3])  # the only markers sit past the first window
    score, lengths = _score(counting, "firstp", doc)
    assert score == 0 and lengths == [64]


def _windows(reranker, doc: str, stride_of_budget: float) -> int:
    """How many windows the cut rule gives: budget = 64 - 3 - query tokens, stride = half (sliding) or all."""
    n = len(reranker.tokenizer.encode_documents([doc])[0])
    budget = 64 - 3 - len(reranker.tokenizer.encode_query("where is the mill", 8))
    stride = int(budget * stride_of_budget)
    return 1 + -(-max(0, n - budget) // stride)


def test_maxp_is_the_best_sliding_window(counting):
    doc = _doc(counting, [1, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    score, lengths = _score(counting, "maxp", doc)
    counts = _marker_counts(counting)
    assert len(counts) == _windows(counting, doc, 0.5) and len(set(counts)) > 1
    assert score == max(counts)  # not the sum, not the mean: the counts differ


def test_sump_adds_every_sliding_window_so_overlaps_count_twice(counting):
    doc = _doc(counting, [1, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    score, _ = _score(counting, "sump", doc)
    counts = _marker_counts(counting)
    assert len(counts) == _windows(counting, doc, 0.5)
    assert score == sum(counts) > 4  # windows overlap by half: the markers are counted more than once


def test_avgp_averages_disjoint_chunks(counting):
    doc = _doc(counting, [1, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    score, _ = _score(counting, "avgp", doc)
    counts = _marker_counts(counting)
    assert len(counts) == _windows(counting, doc, 1.0)
    assert sum(counts) == 4  # disjoint: each marker in exactly one chunk
    assert score == pytest.approx(4 / len(counts))


def test_parade_max_and_avg_fold_pooled_vectors_before_the_head(counting):
    doc = _doc(counting, [2, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    maximum, _ = _score(counting, "parade-max", doc)
    counts = _marker_counts(counting)
    assert len(set(counts)) > 1
    average, _ = _score(counting, "parade-avg", doc)
    assert maximum == max(counts) and average == pytest.approx(np.mean(counts))


def test_keyb2_reads_the_selected_blocks_in_one_sequence(counting):
    # The query's words are in the last sentence only: BM25 selects it; firstp never reads it.
    doc = " ".join(["cats sleep all day long in warm sun."] * 12 + [f"{MARKER} {MARKER} where is the mill."]
                   + ["dogs bark at night near the gate."] * 3)
    score, lengths = _score(counting, "keyb2", doc)
    assert len(lengths) == 1 and score == 2
    evidence = counting.rank("where is the mill", [doc], strategy="keyb2", selector="bm25").results[0].evidence
    assert any(doc[e.start : e.end].startswith(MARKER) for e in evidence)


def _lse(counts) -> float:
    return float(np.logaddexp.reduce(np.asarray(counts, dtype=np.float64)))


def test_keyb2_blocks_reads_each_best_block_alone_and_folds_with_log_sum_exp(counting):
    # Three sentences carry the query's words (BM25's best blocks), two of them markers: read together (keyb2)
    # the markers add up; read alone, each block is its own short sequence and log-sum-exp folds their scores:
    # about the largest, a little more for the second marked block, hardly anything for the unmarked ones.
    doc = " ".join(["cats sleep all day long in warm sun."] * 6 + [f"{MARKER} where is the mill?"]
                   + ["dogs bark at night near the gate."] * 4 + [f"{MARKER} {MARKER} {MARKER} the mill is here."]
                   + ["cats sleep all day long in warm sun."] * 3 + ["the mill by the river."])
    together, _ = _score(counting, "keyb2", doc)
    assert together == 4
    alone = _counting_with(counting, keyb2_blocks=8, keyb2_blocks_span=1)
    score, lengths = _score(alone, "keyb2-blocks", doc)
    counts = _marker_counts(alone)
    blocks = len(counting.pipeline.start("where is the mill", [doc], RerankOptions(strategy="keyb2-blocks")).pieces[0])
    assert len(lengths) == min(8, blocks) and max(lengths) <= 8 + 3 + 12  # query + frame + one block
    assert sorted(counts)[-2:] == [1, 3] and score == pytest.approx(_lse(counts)) and 3 < score < 3.5
    one = _counting_with(counting, keyb2_blocks=1)
    score_one, lengths_one = _score(one, "keyb2-blocks", doc)
    assert len(lengths_one) == 1 and score_one == 1  # BM25's best block, alone: its own score
    evidence = alone.rank("where is the mill", [doc], strategy="keyb2-blocks").results[0].evidence
    assert [doc[e.start : e.end].split()[:3] for e in evidence] == [[MARKER] * 3]  # the block the max came from


def test_keyb2_blocks_reads_adjacent_chosen_blocks_together_up_to_its_span(counting):
    # The query's words sit in two sentences that follow each other, markers in both: each alone gives 2,
    # read together (span 2) the input holds all 4; a third chosen sentence elsewhere stays its own input.
    doc = " ".join(["cats sleep all day long in warm sun."] * 5 + [f"{MARKER} {MARKER} where is the mill?",
                    f"{MARKER} {MARKER} the mill is here."] + ["dogs bark at night near the gate."] * 5
                   + ["the mill by the river."])
    single = _counting_with(counting, keyb2_blocks=3, keyb2_blocks_span=1)
    alone, lengths_alone = _score(single, "keyb2-blocks", doc)
    assert sorted(_marker_counts(single)) == [0, 2, 2] and alone == pytest.approx(_lse([0, 2, 2])) and len(lengths_alone) == 3
    paired = _counting_with(counting, keyb2_blocks=3, keyb2_blocks_span=2)
    score, lengths = _score(paired, "keyb2-blocks", doc)
    assert sorted(_marker_counts(paired)) == [0, 4] and score == pytest.approx(_lse([0, 4])) and len(lengths) == 2
    assert score > alone  # one input reading both halves of the passage beats two reading one each
    evidence = paired.rank("where is the mill", [doc], strategy="keyb2-blocks").results[0].evidence
    assert [doc[e.start : e.end].split()[:2] for e in evidence] == [[MARKER] * 2] * 2  # both blocks of the run
    # A run never holds more than fits next to the query (64 tokens an input here): 8 blocks of ~11 split.
    crowded = " ".join([f"{MARKER} where is the mill by the old river bank?"] * 8)
    wide = _counting_with(counting, keyb2_blocks=8, keyb2_blocks_span=8)
    _, lengths_wide = _score(wide, "keyb2-blocks", crowded)
    assert len(lengths_wide) >= 2 and max(lengths_wide) <= 64 and sum(_marker_counts(wide)) == 8


def test_keyb2_blocks_lead_starts_an_input_at_the_query_inside_the_document_only(counting):
    # One chosen block: markers, then the query's first rare term ("mill"; "is" and "the" are common). Inside
    # the document, the lead setting starts the input `lead` tokens before "mill", leaving the markers out;
    # the same sentence opening the document is read whole, and so is every block with the setting off.
    mill = f"{MARKER} {MARKER} {MARKER} cats nap, the mill is old."
    filler = ["dogs bark at night near the gate."] * 5
    deep, first = " ".join(filler + [mill]), " ".join([mill] + filler)
    anchors = counting.pipeline.anchors(counting.tokenizer.encode_query("where is the mill", 8))
    assert sorted(counting.tokenizer.id_to_token(int(t)) for t in anchors) == ["mill", "where"]
    assert not len(counting.pipeline.anchors(counting.tokenizer.encode_query("what is the", 8)))  # nothing to start at
    whole = _counting_with(counting, keyb2_blocks=1, keyb2_blocks_lead=None)
    assert _score(whole, "keyb2-blocks", deep)[0] == 3
    for lead, read in ((0, "mill is old."), (2, ", the mill is old.")):
        trimmed = _counting_with(counting, keyb2_blocks=1, keyb2_blocks_lead=lead)
        score, lengths = _score(trimmed, "keyb2-blocks", deep)
        assert score == 0 and len(lengths) == 1
        evidence = trimmed.rank("where is the mill", [deep], strategy="keyb2-blocks").results[0].evidence
        assert deep[evidence[0].start : evidence[0].end] == read
        assert _score(trimmed, "keyb2-blocks", first)[0] == 3  # the document's opening block is read whole
    lengths = {lead: _score(_counting_with(counting, keyb2_blocks=1, keyb2_blocks_lead=lead), "keyb2-blocks", deep)[1][0]
               for lead in (0, 2)}
    assert lengths[2] == lengths[0] + 2
    # Two chosen blocks read as one run, the first with common query words only ("is", "the"): the input starts
    # in the second, before "mill", and the first block is neither read nor evidence.
    run = " ".join(filler[:1] + ["dogs bark at night near a gate."] * 4 + [f"{MARKER} {MARKER} it is the old barn.",
                                                                              f"{MARKER} cats nap by the mill now."])
    paired = _counting_with(counting, keyb2_blocks=2, keyb2_blocks_span=2, keyb2_blocks_lead=None)
    assert _score(paired, "keyb2-blocks", run)[0] == 3 and len(paired.scorer.seen[-1].ids) == 1
    skipped = _counting_with(counting, keyb2_blocks=2, keyb2_blocks_span=2, keyb2_blocks_lead=2)
    assert _score(skipped, "keyb2-blocks", run)[0] == 0
    evidence = skipped.rank("where is the mill", [run], strategy="keyb2-blocks").results[0].evidence
    assert [run[e.start : e.end] for e in evidence] == ["by the mill now."]


def _counting_with(counting, **overrides) -> Reranker:
    """The counting reranker under other settings (same marker scorer and head)."""
    other = Reranker(counting.settings.with_overrides(**overrides), scorer=MarkerCounter(counting.scorer.marker_id))
    other.head = counting.head
    return other


def test_keyb2_in_two_passes_scores_the_best_pass_with_its_evidence(counting):
    # Pass one reads the query's sentences (BM25's best); the markers sit in the next best, which
    # only a second pass reads.
    doc = " ".join(["cats sleep all day long in warm sun."] * 8 + ["where is the mill by the river?"] * 6
                   + [f"{MARKER} {MARKER} {MARKER} the mill wheel turns."] + ["dogs bark at night near the gate."] * 3)
    one = _counting_with(counting, keyb2_min_score_share=None)
    score_one, lengths_one = _score(one, "keyb2", doc)
    assert len(lengths_one) == 1 and score_one == 0
    two = _counting_with(counting, keyb2_min_score_share=None, keyb2_passes=2)
    score_two, lengths_two = _score(two, "keyb2", doc)
    assert len(lengths_two) == 2 and _marker_counts(two) == [0, 3] and score_two == 3
    evidence = two.rank("where is the mill", [doc], strategy="keyb2", selector="bm25").results[0].evidence
    assert any(doc[e.start : e.end].startswith(MARKER) for e in evidence)  # the best pass argues for the score
    short = "where is the mill?"  # one block: nothing is left for a second pass, which is not scored
    assert len(_score(two, "keyb2", short)[1]) == 1


def test_keyb2_fused_with_the_selector_ranks_equal_model_scores_by_block_evidence(counting):
    on_topic, off_topic = "where is the mill? the mill is by the river.", "cats sleep all day long in warm sun."
    plain = counting.rank("where is the mill", [off_topic, on_topic], strategy="keyb2", selector="bm25")
    assert [r.score for r in plain.results] == [0.0, 0.0] and plain.results[0].index == 0  # a tie, kept in order
    fused = _counting_with(counting, keyb2_fusion_weight=1.0).rank(
        "where is the mill", [off_topic, on_topic], strategy="keyb2", selector="bm25")
    assert [(r.index, r.score) for r in fused.results] == [(1, 1.0), (0, -1.0)]  # model 0 + z of the best block
    # The fold reads the request's settings as resolved, not the service's: a Resolved that fuses, fuses.
    import asyncio
    import dataclasses

    resolved = counting.pipeline.resolve(RerankOptions(strategy="keyb2", selector="bm25"))
    resolved = dataclasses.replace(resolved, settings=resolved.settings.with_overrides(keyb2_fusion_weight=1.0))
    by_resolved = asyncio.run(counting.arank("where is the mill", [off_topic, on_topic], resolved))
    assert [(r.index, r.score) for r in by_resolved.results] == [(1, 1.0), (0, -1.0)]


PINNED = {
    "firstp": ("prefix", "single"),
    "maxp": ("sliding", "max"),
    "sump": ("sliding", "sum"),
    "avgp": ("disjoint", "mean"),
    "parade-max": ("sliding", "parade-max"),
    "parade-avg": ("sliding", "parade-avg"),
    "parade-attn": ("sliding", "trained"),
    "parade-transformer": ("sliding", "trained"),
    "keyb2-parade-max": ("blocks", "parade-max"),
    "keyb2-parade-avg": ("blocks", "parade-avg"),
    "keyb2-blocks": ("key-blocks", "lse"),
    "keyb2-blocks-attn": ("key-blocks", "trained"),
    "longp": ("whole", "single"),
    "cedr-knrm": ("disjoint", "trained"),
    "cedr-drmm": ("disjoint", "trained"),
    "cedr-pacrr": ("disjoint", "trained"),
    "model1": ("disjoint", "trained"),
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_registry_rows_match_the_behaviour_pinned_above(name):
    spec = REGISTRY[name]
    assert (spec.cut.name, spec.aggregation) == PINNED[name]
    assert spec.needs_pooled == (spec.aggregation in ("parade-max", "parade-avg", "trained"))
    # The interaction strategies are scored by their own graph, which training writes beside their head.
    assert (spec.features is not None) == (name in ("cedr-knrm", "cedr-drmm", "cedr-pacrr", "model1"))
    assert spec.features is None or spec.features in spec.trained_parts


def _counting_long(counting, max_length: int, **overrides) -> Reranker:
    """The counting reranker on a model that reads ``max_length`` tokens (the same tokenizer, a longer frame)."""
    from dataclasses import replace

    from keyrank.pipeline import Pipeline

    settings = counting.settings.with_overrides(**overrides)
    pipeline = Pipeline(counting.tokenizer, replace(counting.template, max_length=max_length), settings,
                        manifest=counting.pipeline.manifest)
    other = Reranker(settings, scorer=MarkerCounter(counting.scorer.marker_id), pipeline=pipeline)
    other.head = counting.head
    return other


def test_longp_reads_the_whole_document_in_one_sequence_where_firstp_stops(counting):
    long = _counting_long(counting, 4096)
    doc = _doc(long, [0] * 12 + [3] + [0] * 30)  # the markers sit past firstp's 64 tokens
    assert _score(long, "firstp", doc) == (0, [64])
    score, lengths = _score(long, "longp", doc)
    result = long.rank("where is the mill", [doc], strategy="longp").results[0]
    assert score == 3 and len(lengths) == 1 and lengths[0] > 64
    assert not result.truncated and result.read_tokens == result.document_tokens > 300
    assert [(e.start, e.end) for e in result.evidence] == [(0, len(doc))]  # the whole text argues for the score


def test_longp_cuts_at_the_models_own_length_and_says_so(counting):
    long = _counting_long(counting, 128)
    doc = _doc(long, [0] * 40)
    result = long.rank("where is the mill", [doc], strategy="longp").results[0]
    assert long.scorer.seen[-1].tokens == 128 and result.truncated and result.read_tokens < result.document_tokens


def test_a_model_no_longer_than_the_other_strategies_read_refuses_longp_instead_of_being_firstp(counting):
    from keyrank.errors import InvalidRequest

    bert = _counting_long(counting, 512, max_sequence_length=512)  # the prepared MiniLM as served
    with pytest.raises(InvalidRequest, match=r"reads at most 512 tokens .*longp would be firstp") as refused:
        bert.rank("where is the mill", ["the mill"], strategy="longp")
    assert refused.value.field == "strategy"
    capped = _counting_long(counting, 4096, longp_max_length=64)
    with pytest.raises(InvalidRequest, match="KEYRANK_LONGP_MAX_LENGTH is 64"):
        capped.rank("where is the mill", ["the mill"], strategy="longp")


def test_a_strategy_without_its_trained_part_is_refused_naming_the_command(counting, tmp_path):
    from keyrank.errors import InvalidRequest
    from keyrank.pipeline import Pipeline

    bare = Pipeline(counting.tokenizer, counting.template, counting.settings, gateway_dir=tmp_path)
    for name in ("parade-attn", "parade-transformer", "keyb2-blocks-attn"):
        with pytest.raises(InvalidRequest, match=f"keyrank finetune --strategy {name}"):
            bare.resolve(RerankOptions(strategy=name))


def test_readme_strategy_table_is_the_registry():
    from pathlib import Path

    from keyrank.strategies import markdown_table

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert markdown_table() in readme


def test_readme_selector_table_is_the_registry():
    from pathlib import Path

    from keyrank.select import markdown_table

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert markdown_table() in readme


def test_whether_a_trained_part_is_installed_is_one_rule_that_resolution_follows(counting, tmp_path):
    cedr = REGISTRY["cedr-knrm"]
    assert cedr.missing_parts(None) == list(cedr.trained_parts) and REGISTRY["maxp"].missing_parts(None) == []
    (tmp_path / "cedr-knrm.onnx").write_bytes(b"")
    assert cedr.missing_parts(tmp_path) == ["cedr-knrm-features.onnx"]  # a head without its graph is not installed
    from keyrank.errors import InvalidRequest
    from keyrank.pipeline import Pipeline

    bare = Pipeline(counting.tokenizer, counting.template, counting.settings, gateway_dir=tmp_path)
    with pytest.raises(InvalidRequest, match=r"needs its trained part \(cedr-knrm-features.onnx\)"):
        bare.resolve(RerankOptions(strategy="cedr-knrm"))


def test_what_each_document_read_is_worked_out_once_and_answered_as_the_plan_says(counting):
    short, long = "the quiet river ran past an old mill.", _doc(counting, [0] * 20)
    plan = counting.pipeline.plan("where is the mill", [short, long], RerankOptions(strategy="firstp"))
    assert plan.coverage is plan.coverage and plan.truncated == [False, True]
    results, usage = counting.fold(plan, np.zeros(len(plan.inputs), np.float32), None)
    by_index = sorted(results, key=lambda r: r.index)
    assert [r.truncated for r in by_index] == plan.truncated and usage.truncated_documents == 1
    assert [(r.read_tokens, r.document_tokens) for r in by_index] == plan.coverage


def test_a_trainable_row_that_needs_its_trained_part_plans_as_a_row_of_its_cut_that_needs_none():
    # The registry's trainable and plans_as columns are training's one table of strategies (planned.py reads them).
    from keyrank.training.planned import TRAINABLE, planning_strategy

    assert TRAINABLE == tuple(name for name, spec in REGISTRY.items() if spec.trainable)
    for name, spec in REGISTRY.items():
        assert (spec.plans_as is not None) == (spec.trainable and bool(spec.trained_parts)), name
        if spec.plans_as is not None:
            row = REGISTRY[spec.plans_as]
            assert row.cut is spec.cut and not row.trained_parts and row.plans_as is None, name
            assert planning_strategy(name) == spec.plans_as
    assert {planning_strategy(n) for n in ("parade-attn", "parade-transformer", "cedr-knrm", "model1")} == {"parade-max", "avgp"}
