"""`keyrank bench --peers`: its arithmetic (medians, pairs/s, ratios, share of the MatMul peak), the score
agreement check, and that peers which are not installed are reported, not silently dropped. Not that
anyone is fast: that is what the bench measures (docs/PERFORMANCE.md)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from keyrank.bench import peer_systems, peers
from keyrank.bench.peer_systems import Peer
from keyrank.bench.peers import FLOP_PER_512_PAIR


def test_rows_are_medians_of_interleaved_rounds_as_pairs_per_second_ratios_and_shares_of_the_peak():
    seconds = {"keyrank": [2.0, 1.0, 3.0], "other": [4.0, 5.0, 3.0]}  # medians 2.0 s and 4.0 s
    rows = peers.summarize(seconds, pairs=48, reference="keyrank", peak_flops=400e9, flop_per_pair=FLOP_PER_512_PAIR)
    assert rows["keyrank"]["median_s"] == 2.0 and rows["keyrank"]["pairs_per_s"] == 24.0 and rows["keyrank"]["ratio"] == 1.0
    assert rows["other"]["pairs_per_s"] == 12.0 and rows["other"]["ratio"] == 0.5 and rows["other"]["rounds"] == 3
    # 24 pairs/s x 13.3 GFLOP = 319.2 GFLOP/s = 79.8 % of a 400 GFLOP/s peak.
    assert rows["keyrank"]["gflop_per_s"] == pytest.approx(319.2)
    assert rows["keyrank"]["share_of_peak"] == pytest.approx(0.798)
    assert rows["other"]["share_of_peak"] == pytest.approx(0.399)
    short = peers.summarize(seconds, pairs=160, reference="keyrank", peak_flops=None, flop_per_pair=None)
    assert "share_of_peak" not in short["keyrank"] and short["other"]["ratio"] == 0.5


def test_rounds_alternate_the_order_so_no_system_keeps_the_better_place():
    names = ["keyrank-local", "st-openvino", "st-torch"]
    orders = [peers.round_order(names, r) for r in range(4)]
    assert orders == [names, names[::-1], names, names[::-1]]
    assert all(sorted(o) == sorted(names) for o in orders)
    # Over an even number of rounds the first and the last system hold each end equally often.
    places = {n: sorted(o.index(n) for o in orders) for n in names}
    assert places == {"keyrank-local": [0, 0, 2, 2], "st-openvino": [1, 1, 1, 1], "st-torch": [0, 0, 2, 2]}


def test_each_row_is_compared_with_the_fastest_peer_and_the_bf16_peak():
    rows = {"keyrank local": {"pairs_per_s": 24.0}, "keyrank, Triton": {"pairs_per_s": 30.0},
            "fastembed": {"pairs_per_s": 12.0}, "flashrank": {"pairs_per_s": 16.0}}
    peers.against_peers(rows, bf16_peak=638.4e9)
    # keyrank's own rows are not peers: the fastest peer is flashrank's 16 pairs/s.
    assert rows["keyrank local"]["vs_fastest_peer"] == 1.5 and rows["fastembed"]["vs_fastest_peer"] == 0.75
    assert rows["keyrank local"]["share_of_bf16_peak"] == pytest.approx(0.5)  # 24 x 13.3 GFLOP / 638.4
    short = {"keyrank local": {"pairs_per_s": 24.0}}
    peers.against_peers(short, bf16_peak=None)
    assert short["keyrank local"] == {"pairs_per_s": 24.0}  # no peer measured, no peak: nothing made up


def test_a_peer_scoring_with_another_model_is_flagged():
    keyrank = [np.array([3.0, 1.0, -2.0]), np.array([0.5, 0.1])]
    monotone = [1 / (1 + np.exp(-s)) for s in keyrank]  # flashrank's sigmoid: same ranking
    assert peers.agreement(keyrank, monotone) == pytest.approx(1.0)
    reversed_ = [-s for s in keyrank]
    assert peers.agreement(keyrank, reversed_) < peers.AGREEMENT_MIN


def test_peers_that_are_not_installed_are_reported_with_what_to_install(capsys):
    absent = Peer("no such reranker", "keyrank_no_such_module_for_tests", "no-such-reranker", lambda *_: None)
    present = Peer("numpy-based", "numpy", "numpy", lambda *_: None)
    ok, missing = peer_systems.available([present, absent])
    assert ok == [present]
    assert missing == {"no such reranker": "not installed (pip install no-such-reranker, or the 'peers' extra)"}
    # Every bench peer is either installed here or reported the same way.
    ok, missing = peer_systems.available(peer_systems.PEERS)
    assert {p.name for p in ok} | set(missing) == {p.name for p in peer_systems.PEERS}
    assert peer_systems.PEERS[0].module is None and peer_systems.PEERS[0] in ok  # keyrank in-process is always there: the reference

    result = {"threads": 2, "rounds": 1, "load_average": (1.0, 1.0, 1.0), "matmul_peak_gflop_per_s": {"fp32": 100.0, "int8": 300.0},
              "missing": {"no such reranker": "not installed (pip install no-such-reranker, or the 'peers' extra)"},
              "workloads": {}}
    peers.print_table(result)
    assert "not measured: no such reranker: not installed (pip install no-such-reranker" in capsys.readouterr().out


def test_the_matmul_peak_is_measured_in_fp32_and_int8_and_bf16_where_the_cpu_has_it():
    from keyrank.scoring import openvino

    peak = peers.matmul_peak(threads=1, repeats=1, n=256)
    assert peak["fp32"] > 1e8 and peak["int8"] > 1e8
    assert ("bf16" in peak) == openvino.bf16_supported() and peak.get("bf16", 1e9) > 1e8


def test_every_bench_option_says_its_default(capsys):
    from keyrank.bench import main

    with pytest.raises(SystemExit):
        main(["--help"])
    blocks = capsys.readouterr().out.split("options:")[1].split("\n  --")[1:]
    assert len(blocks) >= 15
    for block in blocks:
        assert "(default:" in " ".join(block.split()), block.split()[0]


def test_each_row_says_how_far_its_scores_are_from_fp32_in_logits():
    fp32 = [np.array([3.0, 1.0, -2.0]), np.array([0.5, 0.1])]
    bf16 = [np.array([3.02, 0.99, -2.0]), np.array([0.5, 0.06])]
    assert peers.fp32_difference(fp32, bf16) == pytest.approx(0.04)
    # flashrank returns sigmoid(logit): mapped back before the difference, so the same logits differ by ~0
    assert peers.fp32_difference(fp32, [1 / (1 + np.exp(-s)) for s in fp32], probability=True) < 1e-9


def test_systems_are_chosen_by_key_with_keyrank_in_process_always_first():
    chosen = peer_systems.select(["st-onnx*", "flashrank"])
    assert [p.key for p in chosen] == ["keyrank-local", "st-onnx", "st-onnx-o3", "st-onnx-qint8", "flashrank"]
    assert peer_systems.select(["*"]) == list(peer_systems.PEERS)
    with pytest.raises(SystemExit, match="no system matched"):
        peer_systems.select(["no-such-peer"])
    assert len({p.key for p in peer_systems.PEERS}) == len(peer_systems.PEERS) and all(p.key for p in peer_systems.PEERS)
    assert any(p.key == peer_systems.FP32_REFERENCE for p in peer_systems.PEERS)


def test_a_peer_runs_under_another_interpreter_by_key_or_glob():
    assert peer_systems.peer_pythons(["st-onnx*=/opt/onnx/bin/python"]) == dict.fromkeys(["st-onnx", "st-onnx-o3", "st-onnx-qint8"], "/opt/onnx/bin/python")
    with pytest.raises(SystemExit, match="KEY=PYTHON"):
        peer_systems.peer_pythons(["st-onnx"])
    # a peer run elsewhere is not looked for here
    absent = Peer("elsewhere", "keyrank_no_such_module_for_tests", "x", lambda *_: None, "far")
    assert peer_systems.available([absent], {"far": "/opt/x/bin/python"}) == ([absent], {})


def test_a_worker_process_scores_groups_line_by_line(monkeypatch, tmp_path):
    import sys

    fake = Peer("fake", None, "keyrank", lambda *_: (lambda groups: [np.arange(len(docs), dtype=float) for _, docs in groups]), "fake")
    monkeypatch.setattr(peer_systems, "PEERS", (fake,))
    monkeypatch.setattr(sys, "stdin", iter(['[["q", ["a", "b", "c"]]]\n', '[["q", ["a"]], ["r", ["b", "c"]]]\n']))
    out = tmp_path / "out"
    with out.open("w") as handle:
        monkeypatch.setattr(sys, "stdout", handle)
        assert peer_systems.worker(["fake", "models", "checkpoint", "2"]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines == [{"ready": True}, {"scores": [[0.0, 1.0, 2.0]]}, {"scores": [[0.0], [0.0, 1.0]]}]
