"""A prepared model folder as `keyrank prepare` would leave it for another CPU variant, built from the
session's prepared folder without exporting again: its weights linked, the manifest's CPU entry and the
embedded repository's ``runtime.json`` rewritten. The OpenVINO variants but int8 serve the fp32 export
as it is, so such a copy serves exactly what `keyrank prepare --cpu-variant openvino-bf16` would."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def _link_weights(src: str, dst: str) -> None:
    """Weights are linked; the small files copied, since a model reads its neighbours (runtime.json) beside
    its own resolved path."""
    if Path(src).stat().st_size > 2**20:
        Path(dst).symlink_to(Path(src).resolve())
    else:
        shutil.copy2(src, dst)


def as_variant(prepared: Path, out: Path, variant: str, runtime: dict | None) -> Path:
    """``prepared`` copied into ``out`` (its weights linked) with CPU variant ``variant`` run by ``runtime`` (None: no runtime.json,
    i.e. ONNX Runtime); an OpenVINO variant serves the production (fp32) model.onnx."""
    shutil.copytree(prepared, out, copy_function=_link_weights, ignore=shutil.ignore_patterns("cpu", "__pycache__"))
    manifest_path = out / "gateway" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["cross_encoder"]["cpu"] = {"variant": variant, **({"runtime": runtime} if runtime else {})}
    manifest_path.write_text(json.dumps(manifest))
    version = out / "triton-embedded" / "cross_encoder" / "1"
    (version / "runtime.json").unlink(missing_ok=True)
    if runtime:
        (version / "runtime.json").write_text(json.dumps(runtime))
    if (runtime or {}).get("runtime") == "openvino":
        (version / "model.onnx").unlink()
        (version / "model.onnx").symlink_to((prepared / "triton" / "cross_encoder" / "1" / "model.onnx").resolve())
    return out
