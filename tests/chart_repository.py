"""The Helm chart's model-repository init container (``models.served``) as a local shell script: rendered with the
chart's helm (.tools/bin/helm, skipped when it is not installed), its /models and /repository pointed at a test's
folders, each model's `keyrank prepare` output standing in for its /models/<name>/ volume."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def build_served_repository(models: dict[str, Path], root: Path, repository: str = "triton-embedded") -> Path:
    """Run the chart's script over ``models`` ({served name: prepared folder}); the repository it built. With the
    default ``repository`` (triton-embedded) the chart is rendered for the CPU Triton (triton.gpu.enabled=false),
    whose script reads the very repository the tritonserver of this machine loads; "triton" renders the GPU one."""
    helm = ROOT / ".tools" / "bin" / "helm"
    if not helm.exists():
        pytest.skip("helm not installed in .tools/ (scripts/install-tools.sh; tests/test_deploy.py installs it)")
    if repository not in ("triton", "triton-embedded"):
        raise ValueError(f"the chart serves triton/ (GPU) or triton-embedded/ (CPU), not {repository}/")
    values = root / "values.yaml"
    values.write_text(yaml.safe_dump({"models": {"served": [{"name": n, "model": "m"} for n in models]},
                                      "triton": {"gpu": {"enabled": repository == "triton"}}}))
    rendered = subprocess.run([str(helm), "template", "k", str(ROOT / "k8s" / "keyrank"), "-f", str(values)],
                              capture_output=True, text=True, check=True, timeout=60).stdout
    triton = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-triton"))
    script = next(c for c in triton["spec"]["template"]["spec"]["initContainers"] if c["name"] == "model-repository")["command"][2]
    assert f"/{repository}/cross_encoder/config.pbtxt" in script, script
    (root / "models").mkdir(parents=True)
    for name, folder in models.items():
        (root / "models" / name).symlink_to(Path(folder).resolve())
    local = script.replace("/models/", f"{root}/models/").replace("/repository", f"{root}/repository")
    subprocess.run(["sh", "-c", local], check=True, timeout=30)
    return root / "repository"
