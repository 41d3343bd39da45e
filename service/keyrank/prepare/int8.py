"""The calibrated int8 CPU variant, ``openvino-int8``: NNCF post-training quantization of the fp32 export,
calibrated on real query-document pairs of the training data, run by OpenVINO.

CPUs with VNNI or AMX multiply int8 at about twice bfloat16's rate. Dynamic int8 (``int8``, scales
from each batch's own range) reorders rankings here; static int8 with ONNX Runtime's MinMax or
percentile calibration did worse. NNCF's transformer mode is what this variant uses instead: it keeps
the operations rankings are sensitive to in floating point (softmax, layer norms, the residual adds),
smooths the activation outliers into the weights (SmoothQuant) before choosing per-tensor activation
scales, and corrects each layer's bias for the rounding; weights are per channel.

The result is a QDQ ONNX graph (``model.openvino-int8.onnx``): OpenVINO reads it as int8 MatMuls and
computes the rest in bf16 (f32 without bf16), so both CPU paths serve it like ``openvino-bf16``, from the
same ``runtime.json``. The gate decides, not the speed: it scores the gate's pairs (never calibrated on)
like any variant.

Calibration pairs (``calibration_pairs``): QMSum *train* meetings, the gate's first meetings and the
dev meetings (`keyrank eval --split train-dev`) left out, chunks of 500 tokens next to their meeting's
queries; and DL20 passages of the *training* topics (never the held-back ones far-relevant reports, nor
the gate's queries). Nothing of a validation or test split.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

CALIBRATION_QMSUM_MEETINGS = 24
"""QMSum train meetings read for calibration (after the gate's and without the dev ones)."""
CALIBRATION_QMSUM_CHUNKS = 4
"""500-token chunks per meeting, each next to one of the meeting's queries."""
CALIBRATION_DL20_QUERIES = 12
"""DL20 training topics read for calibration, with ``CALIBRATION_DL20_PASSAGES`` BM25 passages each."""
CALIBRATION_DL20_PASSAGES = 8
KEPT_FLOAT = (r".*pooler.*", r".*classifier.*", r".*layer\.[0-9]+/output/dense.*")
"""Left in floating point: the head (pooler, classifier) and each layer's FFN output projection, whose
input (after GELU) carries the outliers one activation scale cannot hold: on the gate's pairs all
quantized had mean Kendall tau 0.955 (max |diff| 0.73), these kept float 0.979 (0.23)."""
BATCH = 4
"""Rows per calibration sample (padded to the longest, as the served batches are)."""


def calibration_pairs(datasets: Path, text_tokenizer, *, skip_qmsum: int = 3, skip_dl20: int = 8
                      ) -> tuple[list[tuple[str, str]], dict[str, list[str]]]:
    """(query, document) pairs for calibration and what they were drawn from (QMSum meeting names, DL20
    query ids). ``skip_*``: the gate's own meetings and DL20 queries (``gate.gate_groups``), never
    calibrated on."""
    from keyrank.data.splits import dl20_held_back, qmsum_dev_meeting

    pairs: list[tuple[str, str]] = []
    used: dict[str, list[str]] = {"qmsum_meetings": [], "dl20_qids": []}
    meetings = [p for p in sorted((datasets / "qmsum" / "train").glob("*.json"))[skip_qmsum:] if not qmsum_dev_meeting(p.stem)]
    for path in meetings:
        if len(used["qmsum_meetings"]) == CALIBRATION_QMSUM_MEETINGS:
            break
        meeting = json.loads(path.read_text())
        queries = [q["query"] for q in meeting.get("specific_query_list", [])]
        if not queries:
            continue
        text = "\n".join(f"{t['speaker']}: {t['content']}" for t in meeting["meeting_transcripts"])
        (enc,) = text_tokenizer.encode_documents([text])
        starts = list(range(0, max(1, len(enc) - 500), 500))
        step = max(1, len(starts) // CALIBRATION_QMSUM_CHUNKS)  # spread over the meeting
        for i, s in enumerate(starts[::step][:CALIBRATION_QMSUM_CHUNKS]):
            pairs.append((queries[i % len(queries)], enc.text[slice(*enc.char_span(s, s + 500))]))
        used["qmsum_meetings"].append(path.stem)
    dl20 = datasets / "trec-dl20-passage" / "bm25_dl20.json"
    if dl20.exists():
        rows = [r for r in json.loads(dl20.read_text())[skip_dl20:] if r["hits"] and not dl20_held_back(str(r["hits"][0]["qid"]))]
        for row in rows[:CALIBRATION_DL20_QUERIES]:
            pairs += [(row["query"], hit["content"]) for hit in row["hits"][:CALIBRATION_DL20_PASSAGES]]
            used["dl20_qids"].append(str(row["hits"][0]["qid"]))
    return pairs, used


def calibration_feeds(datasets: Path, text_tokenizer, template) -> tuple[list[dict], str]:
    """``calibration_pairs`` as model inputs, framed as the gateway frames them, in batches of ``BATCH``
    rows of similar length, and where they came from."""
    pairs, used = calibration_pairs(datasets, text_tokenizer)
    if not pairs:
        raise FileNotFoundError(f"no QMSum train meetings or DL20 training topics under {datasets}: nothing to calibrate on")
    # Long and short pairs apart, so a batch is padded as served batches are (length buckets), not to 512 for one long row.
    pairs.sort(key=lambda p: len(p[1]))
    feeds = [_feeds(text_tokenizer, template, pairs[i:i + BATCH]) for i in range(0, len(pairs), BATCH)]
    return feeds, (f"{datasets}: {len(pairs)} training pairs ({len(used['qmsum_meetings'])} QMSum train meetings x <= "
                   f"{CALIBRATION_QMSUM_CHUNKS} chunks of 500 tokens, {len(used['dl20_qids'])} DL20 training topics x "
                   f"{CALIBRATION_DL20_PASSAGES} BM25 passages)")


def _feeds(text_tokenizer, template, pairs: list[tuple[str, str]]) -> dict[str, np.ndarray]:
    from keyrank.prepare.cross_encoder import template_batch

    ids, mask, types = (t.numpy() for t in template_batch(text_tokenizer, template, pairs))
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def quantize(fp32: Path, target: Path, feeds: list[dict], *, ignored: tuple[str, ...] = ()) -> dict:
    """NNCF post-training quantization of the fp32 ONNX export into a QDQ ONNX graph at ``target``;
    ``ignored``: node-name patterns (regular expressions) kept in floating point. Returns how it was made."""
    import nncf
    import onnx
    from nncf.parameters import ModelType
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters

    started = time.perf_counter()
    model = onnx.load(str(fp32))
    names = {i.name for i in model.graph.input}
    dataset = nncf.Dataset([{k: v for k, v in f.items() if k in names} for f in feeds])
    quantized = nncf.quantize(model, dataset, preset=nncf.QuantizationPreset.MIXED, model_type=ModelType.TRANSFORMER,
                              subset_size=len(feeds), fast_bias_correction=True,
                              ignored_scope=nncf.IgnoredScope(patterns=list(ignored), validate=False) if ignored else None,
                              advanced_parameters=AdvancedQuantizationParameters())
    target.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(quantized, str(target))
    ops: dict[str, int] = {}
    for node in quantized.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return {"quantizer": f"nncf {nncf.__version__}, transformer mode, mixed preset", "calibration_batches": len(feeds),
            "kept_float": list(ignored), "qdq_ops": ops, "seconds": round(time.perf_counter() - started, 1)}
