"""CPU variants of the exported cross-encoder, and the quality gate every variant passes at prepare time.

The exported ``model.onnx`` (fp32, unfused, what the GPU repository serves) is the reference. From it:

- ``fused``: ONNX Runtime's transformer optimizer (``onnxruntime.transformers.optimizer``, model type
  ``bert``: fused attention, layer norms, GELU and embeddings) for the encoder families it supports;
  the same arithmetic, so its scores are equal up to float rounding.
- ``int8``: the fused graph with dynamic, per-channel int8 weights (``onnxruntime.quantization``) on
  every MatMul/Attention.
- ``int8-selective``: the same, with the layers ranking is most sensitive to kept fp32 (the classifier
  head and pooler, each layer's attention output and FFN output projection).
- ``openvino-bf16``: the fp32 export unchanged, run by OpenVINO's CPU plugin in bfloat16 where the CPU
  has it (scoring/openvino.py); ``openvino``: the same in fp32. Nothing is built: the served folder gets
  a ``runtime.json`` that both CPU paths read.
- ``openvino-int8``: NNCF post-training int8, calibrated on training pairs (prepare/int8.py), a QDQ graph
  OpenVINO runs with int8 MatMuls and the rest as ``openvino-bf16``.

Every variant passes the quality gate (gate.py: its rankings and scores on real pairs against the fp32
reference) before it is kept; a variant that fails is refused with its numbers (``VariantRefused``) and
nothing serves it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from keyrank.errors import KeyrankError
from keyrank.prepare.gate import GATE_VERSION, GateGroup, VariantRefused, check, gate_groups

log = logging.getLogger(__name__)

VARIANTS: tuple[str, ...] = ("fp32", "fused", "int8", "int8-selective", "openvino", "openvino-bf16", "openvino-int8")
"""Every CPU variant `keyrank prepare --cpu-variant` can build, reference first."""
AUTO = "auto"
"""The default choice, the fastest that passes the gate (docs/PERFORMANCE.md, section 7): ``auto_candidates``
in order, the first that passes, else ``fp32``; each step down with its reason in the manifest
(``cpu.fallback``). A variant named explicitly is refused instead."""
AUTO_CHOICE = "fused"
"""What ``auto`` builds without OpenVINO (where the family is fused)."""
AUTO_BF16 = "openvino-bf16"
"""What ``auto`` tries first where the CPU computes bfloat16: 2.1x fused on 512-token pairs here."""
AUTO_INT8 = "openvino-int8"
"""The calibrated int8 variant: fast int8 CPUs (VNNI, AMX), served when asked for by name."""
INT8_NOT_IN_AUTO = ("not tried by auto: it passes the gate, but its nDCG@10 on a full split is at or outside 0.005 "
                    "of fp32 (keyb2-bm25, QMSum val: ce-minilm-l6 -0.007 [-0.013, -0.003], a keyb2 scorer fine-tuned "
                    "from it -0.005 [-0.011, +0.001]), and on a CPU with AMX it is no faster than openvino-bf16 "
                    "(0.95-1.01x at 512 tokens; docs/PERFORMANCE.md section 7); ask for it with --cpu-variant openvino-int8")
"""Why ``auto`` does not serve ``openvino-int8``, written into the manifest: the gate is necessary, the
ranking on full splits decides, and int8 lost the bound there for the base scorer, reached it for a fine-tuned
one, and bought no speed on the CPU that measured it."""
OPENVINO = {"openvino": "f32", "openvino-bf16": "bf16", "openvino-int8": "bf16"}
"""The variants OpenVINO runs, and the precision each asks of it (int8: of the operations left in floating point)."""
BUILT_FOR_OPENVINO = frozenset({"openvino-int8"})
"""OpenVINO variants with a model of their own (the others serve the fp32 export as it is)."""
FUSION_FAMILIES = frozenset({"bert", "electra", "distilbert", "roberta", "xlm-roberta", "camembert"})
"""HF model types whose graphs ONNX Runtime's optimizer fuses as model type ``bert`` (encoder-only BERT
descendants). Other families keep the fp32 graph on CPU (prepare says so)."""

# --- what `keyrank prepare` calls ---------------------------------------------------


def prepare_cpu(out: Path, ce_entry: dict, fp32: Path, gateway: Path, variant: str, datasets: Path | None,
                atol: float, force: bool, heads: int = 0) -> tuple[dict, Path]:
    """The CPU model both CPU paths load: built, gated, kept under ``out/cpu/`` (or the fp32 export
    itself); returns its manifest entry and path. ``heads``: the checkpoint's attention heads (0 = let the
    optimizer guess from the graph, which misses the attention fusion of torch exports). Up to date (same variant, export and gate): nothing
    is redone. A refused variant leaves nothing behind and raises ``VariantRefused``."""
    if variant == AUTO:
        from keyrank.scoring import openvino

        reasons, refused = [], None
        if openvino.available():  # said in the manifest: why the int8 variant is not served
            reasons.append(f"{AUTO_INT8}: {INT8_NOT_IN_AUTO}")
        for candidate in auto_candidates(ce_entry["family"]):
            try:
                entry, path = prepare_cpu(out, ce_entry, fp32, gateway, candidate, datasets, atol, force, heads)
            except Exception as exc:  # refused by the gate, or the build failed: the next one, the reason on record
                log.warning("%s; trying the next CPU variant", exc)
                reasons.append(f"{candidate}: {exc}")
                refused = getattr(exc, "report", None)
                continue
            return ({**entry, "fallback": "; ".join(reasons)} if reasons else entry), path
        if ce_entry["family"] not in FUSION_FAMILIES:
            reasons.append(f"no fusion for family {ce_entry['family']!r}")
        return {"variant": "fp32", "gate": "reference", "fallback": "; ".join(reasons),
                **({"refused": refused} if refused else {})}, fp32
    if variant == "fp32":
        return {"variant": "fp32", "gate": "reference"}, fp32
    key = {"variant": variant, "gate_version": GATE_VERSION, "of": ce_entry["fingerprint"], "atol": atol}
    target = out / "cpu" / ce_entry["triton_model"] / f"model.{variant}.onnx"
    old = ce_entry.get("cpu") or {}
    if variant in BUILT_FOR_OPENVINO:
        return _prepare_openvino_int8(variant, key, old, ce_entry, fp32, target, gateway, datasets, atol, force), target
    if variant in OPENVINO:
        return _prepare_openvino(variant, key, old, ce_entry, fp32, gateway, datasets, atol, force), fp32
    if not force and all(old.get(k) == v for k, v in key.items()) and target.exists():
        return old, target
    groups, source = _gate_pairs(ce_entry, gateway, datasets)
    tmp = target.with_name(target.name + ".tmp")
    try:
        made = build(variant, fp32, tmp, family=ce_entry["family"], num_heads=heads, hidden_size=ce_entry["hidden_size"])
        report = check(variant, fp32, tmp, groups, source, atol)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, target)
    return {**key, **made, "gate": report}, target


def auto_candidates(family: str) -> list[str]:
    """What ``auto`` tries, fastest first (512-token pairs, docs/PERFORMANCE.md section 7):
    ``openvino-bf16`` where the CPU computes bfloat16 (2.1x fused), ``openvino`` where OpenVINO is
    installed (fp32, 1.2x fused), ``fused`` where the family is fused. Not ``openvino-int8``
    (``INT8_NOT_IN_AUTO``)."""
    from keyrank.scoring import openvino

    candidates = [AUTO_BF16] if openvino.bf16_supported() else []
    if openvino.available():
        candidates.append("openvino")
    if family in FUSION_FAMILIES:
        candidates.append(AUTO_CHOICE)
    return candidates


def int8_possible(datasets: Path | None) -> str | None:
    """Why ``openvino-int8`` cannot be tried here (None when it can): OpenVINO, NNCF, a CPU with fast int8
    (VNNI/AMX, which OpenVINO lists as INT8) and the training pairs to calibrate on."""
    import importlib.util

    from keyrank.scoring import openvino

    if not openvino.available():
        return "OpenVINO is not installed"
    if importlib.util.find_spec("nncf") is None:
        return "NNCF is not installed (pip install 'keyrank[export]')"
    caps = _cpu_capabilities()
    if "INT8" not in caps:
        return f"this CPU has no fast int8 (OpenVINO lists {', '.join(caps)})"
    if datasets is None or not (Path(datasets) / "qmsum" / "train").is_dir():
        return f"no training pairs to calibrate on under {datasets} (qmsum/train)"
    return None


def _cpu_capabilities() -> list[str]:
    from keyrank.scoring import openvino

    return list(openvino.core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def _prepare_openvino_int8(variant: str, key: dict, old: dict, ce_entry: dict, fp32: Path, target: Path, gateway: Path,
                           datasets: Path | None, atol: float, force: bool) -> dict:
    """The calibrated int8 graph (prepare/int8.py), built beside the other CPU models and gated on OpenVINO."""
    from keyrank.prepare import int8
    from keyrank.prepare.cross_encoder import serving_tokenizer
    from keyrank.scoring import openvino
    from keyrank.template import InputTemplate

    why_not = int8_possible(datasets)
    if why_not:
        raise KeyrankError(f"CPU variant {variant!r} cannot be built here: {why_not}")
    runtime = {"runtime": "openvino", "precision": OPENVINO[variant]}
    here = openvino.precision_here(runtime["precision"])
    if (not force and all(old.get(k) == v for k, v in key.items()) and old.get("runtime") == runtime
            and old.get("computed_in") == here and target.exists()):
        return old
    template = InputTemplate.from_json(ce_entry["template"])
    feeds, calibrated_on = int8.calibration_feeds(datasets, serving_tokenizer(gateway / "tokenizer.json", template), template)
    groups, source = _gate_pairs(ce_entry, gateway, datasets)
    tmp = target.with_name(target.name + ".tmp")
    try:
        made = int8.quantize(fp32, tmp, feeds, ignored=int8.KEPT_FLOAT)
        report = check(variant, fp32, tmp, groups, source, atol, runtime=runtime)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, target)
    return {**key, "runtime": runtime, "computed_in": here, **made, "calibrated_on": calibrated_on,
            "bytes": target.stat().st_size, "gate": report}


def _prepare_openvino(variant: str, key: dict, old: dict, ce_entry: dict, fp32: Path, gateway: Path,
                      datasets: Path | None, atol: float, force: bool) -> dict:
    """The fp32 export on OpenVINO (nothing to build): gated with OpenVINO scoring on this CPU."""
    from keyrank.scoring import openvino

    if not openvino.available():
        raise KeyrankError(f"CPU variant {variant!r} needs OpenVINO: pip install 'keyrank[embedded]' (or openvino)")
    runtime = {"runtime": "openvino", "precision": OPENVINO[variant]}
    here = openvino.precision_here(runtime["precision"])
    if not force and all(old.get(k) == v for k, v in key.items()) and old.get("runtime") == runtime and old.get("computed_in") == here:
        return old
    groups, source = _gate_pairs(ce_entry, gateway, datasets)
    started = time.perf_counter()
    report = check(variant, fp32, fp32, groups, source, atol, runtime=runtime)
    return {**key, "runtime": runtime, "computed_in": here, "gate": report, "gate_seconds": round(time.perf_counter() - started, 1)}


def _gate_pairs(ce_entry: dict, gateway: Path, datasets: Path | None) -> tuple[list[GateGroup], str]:
    from keyrank.prepare.cross_encoder import serving_tokenizer
    from keyrank.template import InputTemplate

    template = InputTemplate.from_json(ce_entry["template"])
    return gate_groups(datasets, serving_tokenizer(gateway / "tokenizer.json", template), template)


def served_variant(model_dir: Path) -> str:
    """The CPU variant a prepared folder serves and what computes it, for reports: e.g. ``openvino-bf16
    (OpenVINO, bf16)``, ``fused (ONNX Runtime)``; ``unknown`` for a folder without a manifest."""
    try:
        cpu = json.loads((Path(model_dir) / "gateway" / "manifest.json").read_text())["cross_encoder"].get("cpu") or {}
    except (OSError, KeyError, ValueError):
        return "unknown"
    if cpu.get("variant") in OPENVINO:
        return f"{cpu['variant']} (OpenVINO, {cpu.get('computed_in', OPENVINO[cpu['variant']])})"
    return f"{cpu.get('variant', 'fp32')} (ONNX Runtime)"


# --- building ----------------------------------------------------------------------


def build(variant: str, fp32: Path, target: Path, *, family: str, num_heads: int, hidden_size: int) -> dict:
    """Write ``variant`` of the fp32 graph to ``target`` (via a temporary file); return how it was made."""
    if variant not in VARIANTS or variant == "fp32" or variant in OPENVINO:
        raise KeyrankError(f"unknown CPU variant {variant!r}; one of {', '.join(VARIANTS)}")
    if family not in FUSION_FAMILIES:
        raise KeyrankError(
            f"CPU variant {variant!r} needs ONNX Runtime's transformer fusion, which keyrank applies to "
            f"{', '.join(sorted(FUSION_FAMILIES))} only, not {family!r}; use --cpu-variant fp32"
        )
    started = time.perf_counter()
    target.parent.mkdir(parents=True, exist_ok=True)
    fused = target.with_name(target.name + ".fused.tmp")
    info = {"fused_ops": fuse(fp32, fused, num_heads=num_heads, hidden_size=hidden_size)}
    try:
        if variant == "fused":
            os.replace(fused, target)
        else:
            tmp = target.with_name(target.name + ".tmp")
            info["kept_fp32"] = quantize(fused, tmp, selective=variant == "int8-selective")
            os.replace(tmp, target)
    finally:
        fused.unlink(missing_ok=True)
    return {**info, "bytes": target.stat().st_size, "build_seconds": round(time.perf_counter() - started, 1)}


def fuse(source: Path, target: Path, *, num_heads: int, hidden_size: int) -> dict[str, int]:
    """ONNX Runtime's transformer optimizer on the fp32 graph (python fusions; the session does the rest
    at load, ``ORT_ENABLE_ALL``); returns the fused operator counts."""
    from onnxruntime.transformers.optimizer import optimize_model

    model = optimize_model(str(source), model_type="bert", num_heads=num_heads, hidden_size=hidden_size,
                           opt_level=0, use_gpu=False)
    model.save_model_to_file(str(target))
    return {k: int(v) for k, v in model.get_fused_operator_statistics().items() if v}


def quantize(source: Path, target: Path, *, selective: bool) -> list[str]:
    """Dynamic per-channel int8 weights; ``selective`` keeps the sensitive nodes fp32. Returns those kept."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    keep = sensitive_nodes(onnx.load(str(source), load_external_data=False)) if selective else []
    quantize_dynamic(str(source), str(target), per_channel=True, weight_type=QuantType.QInt8,
                     op_types_to_quantize=["MatMul", "Attention"], nodes_to_exclude=keep,
                     # the fused ops (com.microsoft domain) defeat ONNX shape inference: their outputs are fp32
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    return keep


def sensitive_nodes(model) -> list[str]:
    """MatMuls whose int8 rounding moves the ranking most: the classifier head and pooler (read the
    final vector), and per layer the attention output and FFN output projections (they write the
    residual stream directly)."""
    keep = []
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm"):
            continue
        if any(part in node.name for part in ("classifier", "pooler", "attention/output/dense", "/output/dense")):
            keep.append(node.name)
    return keep
