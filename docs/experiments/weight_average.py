"""WiSE-FT (Wortsman et al., 2022): a checkpoint whose weights are (1 - a) x the base scorer's + a x a fine-tuned one's.

    python docs/experiments/weight_average.py BASE_DIR FINETUNED_DIR A OUT_DIR
    keyrank prepare --model OUT_DIR --out OUT_DIR-prepared --no-bi-encoder

Both folders hold a Hugging Face checkpoint of the same architecture (``model.safetensors``); the tokenizer and
config are the fine-tuned one's. Averaging the weights of a model and its fine-tuned copy often keeps the base
model's robustness beside the fine-tuned gains: here, whether it keeps keyb2-blocks' far-relevant reading while
meetings gain (docs/EXPERIMENTS.md, 2026-12-02). A diagnostic: nothing in the product reads it.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file


def main(base: Path, finetuned: Path, a: float, out: Path) -> None:
    wb, wf = load_file(base / "model.safetensors"), load_file(finetuned / "model.safetensors")
    if wb.keys() != wf.keys():
        raise SystemExit(f"the checkpoints differ in their tensors: {sorted(set(wb) ^ set(wf))[:5]}")
    out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(finetuned / name, out / name)
    mixed = {k: ((1 - a) * wb[k].float() + a * v.float()).to(v.dtype) if v.is_floating_point() else v for k, v in wf.items()}
    save_file(mixed, out / "model.safetensors")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4]))
