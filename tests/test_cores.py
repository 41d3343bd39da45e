"""The cores keyrank sizes its thread pools and worker counts from (keyrank/cores.py): a container's CPU limit
counts, not only the CPU affinity, in the gateway's own runtimes and in the embedded Triton's model."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from keyrank import cores
from keyrank.modelserver.arguments import PytritonWheel
from keyrank.scoring import openvino
from keyrank.scoring.local import session_options
from shared_data import REPO

MODEL_PY = REPO / "service/keyrank/modelserver/python_models/model.py"
TWO_OF_64 = (64, "200000 100000")
"""A pod with ``limits.cpu: 2`` on a 64-core node."""


@pytest.mark.parametrize(("cpu_max", "usable"), [("max 100000", 16.0), ("200000 100000", 2.0), ("50000 100000", 1.0),
                                                 ("3200000 100000", 16.0), ("garbage", 16.0), (None, 16.0)])
def test_usable_cores_are_the_containers_cpu_limit_where_it_sets_one(machine, cpu_max, usable):
    machine(16, cpu_max)
    assert cores.usable_cores() == usable


@pytest.mark.parametrize(("count", "cpu_max", "threads"), [(64, "250000 100000", 2), (64, "50000 100000", 1), (8, None, 8),
                                                           (8, "max 100000", 8), (1, None, 1)])
def test_thread_count_is_the_usable_cores_rounded_down(machine, count, cpu_max, threads):
    machine(count, cpu_max)
    assert cores.thread_count() == threads


def test_onnx_runtime_runs_as_many_threads_as_the_container_may_use(machine):
    machine(*TWO_OF_64)
    assert session_options().intra_op_num_threads == 2
    assert session_options(threads=5).intra_op_num_threads == 5  # an explicit count stays
    machine(64)
    assert session_options().intra_op_num_threads == 64


@pytest.mark.skipif(not openvino.available(), reason="OpenVINO is not installed")
def test_openvino_runs_as_many_threads_as_the_container_may_use(machine, prepared_models):
    # OpenVINO itself caps the count at the machine's cores, so the limit here is one CPU, below any machine's.
    machine(64, "100000 100000")
    session = openvino.OpenVinoSession(prepared_models / "triton/cross_encoder/1/model.onnx", precision="f32")
    assert session.compiled.get_property("INFERENCE_NUM_THREADS") == 1


def test_the_embedded_triton_is_told_the_usable_cores_unless_the_user_said(machine, monkeypatch):
    machine(*TWO_OF_64)
    assert PytritonWheel().environment()[cores.CORES_ENV] == "2"
    monkeypatch.setenv(cores.CORES_ENV, "6")
    assert PytritonWheel().environment()[cores.CORES_ENV] == "6"


@pytest.fixture
def triton_model(monkeypatch):
    """The embedded Triton's model.py as its stub imports it (it imports nothing from keyrank; its grouping.py
    imports the Python backend's utilities, which the wheel ships)."""
    monkeypatch.setattr(sys, "path", [str(PytritonWheel().python_backend), *sys.path])  # model.py adds its folder too
    monkeypatch.setattr(sys, "dont_write_bytecode", sys.dont_write_bytecode)  # which model.py sets for its process
    before = set(sys.modules)
    spec = importlib.util.spec_from_file_location("embedded_model", MODEL_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    for name in set(sys.modules) - before:  # grouping and the backend's utilities, as the stub names them
        del sys.modules[name]


def test_the_triton_model_divides_the_cores_it_is_told_among_its_instances(machine, monkeypatch, triton_model):
    machine(64)
    config = {"instance_group": [{"count": 2}], "parameters": {"intra_op_thread_count": {"string_value": "0"}}}
    assert triton_model._threads(config) == 32  # told nothing: its affinity
    monkeypatch.setenv(triton_model.CORES_ENV, "4")
    assert triton_model._threads(config) == 2
    monkeypatch.setenv(triton_model.THREADS_ENV, "3")
    assert triton_model._threads(config) == 3  # the user's thread count wins
    assert triton_model.CORES_ENV == cores.CORES_ENV
