"""The embedded Triton under numpy 2: the Python stubs of nvidia-pytriton 0.7 predate numpy 2's dtype layout, so
a Python whose numpy is 2 (PyTorch images ship one) read inputs with zero strides and sent empty outputs until
the models moved tensors through DLPack (modelserver/python_models/grouping.py). This runs the real server from
an environment whose numpy is 2 and checks its scores against the fp32 export's."""

from __future__ import annotations

import pickle
import site
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shared_data import REPO

NUMPY2 = "numpy==2.2.6"  # the newest numpy 2 this Python's wheels and keyrank's pin (<2.3) allow

SCRIPT = """
import pickle, sys
from pathlib import Path
import numpy as np
from keyrank.config import Settings
from shared_data import embedded_scores

models, inputs_path, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
settings = Settings(model_dir=models, embedded_http_port=0, embedded_grpc_port=0, embedded_metrics_port=0)
scores = embedded_scores(models / "triton-embedded", settings, pickle.loads(inputs_path.read_bytes()))
np.save(out, scores.logits)
print(np.__version__)
"""


@pytest.mark.triton
def test_the_embedded_triton_scores_right_when_its_python_has_numpy_2(prepared_models, mixed_inputs, mixed_fp32, tmp_path):
    venv = tmp_path / "numpy2"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    target = next((venv / "lib").glob("python*/site-packages"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), NUMPY2], check=True)
    # numpy 2 in the environment's own site-packages, which come first; everything else from this one after it.
    (target / "keyrank-tests.pth").write_text("\n".join([*site.getsitepackages(), str(REPO / "service"), str(REPO / "tests")]) + "\n")
    (tmp_path / "inputs.pkl").write_bytes(pickle.dumps(mixed_inputs))
    done = subprocess.run([str(venv / "bin" / "python"), "-c", SCRIPT, str(prepared_models), str(tmp_path / "inputs.pkl"),
                           str(tmp_path / "logits.npy")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # That environment had numpy 2; the server's Python stubs run its python (EmbeddedTriton puts it first on PATH).
    assert done.stdout.split()[-1].startswith("2."), done.stdout
    np.testing.assert_allclose(np.load(tmp_path / "logits.npy"), mixed_fp32.logits, atol=1e-4)
