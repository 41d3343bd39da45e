"""The whole model path is supervised: a killed model process (the Python backend stub, the
one an OOM kill picks), an unloaded model or a dead Triton turn /readyz to 503 at once and are
repaired within seconds; past a bounded number of failed repairs `keyrank serve` exits non-zero."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest
from process_tree import BODY, alive, guard_serving, start_serve, stop, stubs_of, tritonserver_of, wait_status

pytestmark = pytest.mark.triton


@pytest.fixture()
def serve(prepared_models: Path, tmp_path: Path):
    log = tmp_path / "serve.log"
    proc, url = start_serve(prepared_models, log)
    try:
        try:
            wait_status(url, "/readyz", 200, timeout=120)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; serve exited: {proc.poll()}\n{log.read_text()[-3000:]}") from None
        yield proc, url
    finally:
        stop(proc)


def test_killed_model_process_turns_readyz_503_within_a_second_and_serves_again_within_10_s(serve):
    proc, url = serve
    assert httpx.post(f"{url}/rerank", json=BODY, timeout=30).status_code == 200
    triton = tritonserver_of(proc.pid)
    (stub,) = stubs_of(triton)

    os.kill(stub, signal.SIGKILL)  # what the OOM killer does to the largest process
    killed = time.monotonic()
    wait_status(url, "/readyz", 503, timeout=1.0)
    assert time.monotonic() - killed < 1.0
    wait_status(url, "/rerank", 200, timeout=10.0 - (time.monotonic() - killed), method="POST", json=BODY)
    assert time.monotonic() - killed < 10.0

    assert httpx.get(f"{url}/readyz").status_code == 200
    assert tritonserver_of(proc.pid) == triton  # repaired by a model reload, not a server restart
    assert stubs_of(triton) and stub not in stubs_of(triton)
    assert httpx.post(f"{url}/rerank", json=BODY, timeout=30).json()["results"][0]["index"] == 0


def test_serve_restarts_a_killed_triton_within_10_s(serve):
    proc, url = serve
    triton = tritonserver_of(proc.pid)
    os.kill(triton, signal.SIGKILL)
    killed = time.monotonic()
    wait_status(url, "/readyz", 503, timeout=1.0)
    wait_status(url, "/rerank", 200, timeout=10.0 - (time.monotonic() - killed), method="POST", json=BODY)
    assert tritonserver_of(proc.pid) != triton


def test_serve_gives_up_after_bounded_repairs_and_exits_non_zero_saying_why(prepared_models, tmp_path):
    # Triton dies and its port is taken meanwhile: every restart fails; the supervisor must stop
    # trying (3 failed attempts here, backing off 0.1 s, 0.2 s) instead of restarting forever.
    log = tmp_path / "serve.log"
    http_port = str(_free_port())
    proc, url = start_serve(prepared_models, log, KEYRANK_EMBEDDED_HTTP_PORT=http_port,
                            KEYRANK_EMBEDDED_MAX_REPAIRS="3", KEYRANK_EMBEDDED_REPAIR_BACKOFF_S="0.1")
    try:
        wait_status(url, "/readyz", 200, timeout=120)
        squatter = socket.socket()
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        triton = tritonserver_of(proc.pid)
        os.kill(triton, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while True:  # take the port the moment the dead server lets go of it
            try:
                squatter.bind(("127.0.0.1", int(http_port)))
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        squatter.listen()
        try:
            code = proc.wait(60)
        finally:
            squatter.close()
    finally:
        stop(proc)
    output = log.read_text()
    assert code == 1, output[-3000:]
    assert "gave up after 3 failed repairs in a row" in output
    assert f"port {http_port} (KEYRANK_EMBEDDED_HTTP_PORT) is taken" in output
    assert output.count("repairing") == 1  # one fault, bounded attempts, then the exit


def test_a_model_unloaded_behind_our_back_is_loaded_again(embedded_triton):
    from keyrank.modelserver.embedded import ADMIN_HEADER

    assert embedded_triton.admin.model_ready(embedded_triton.model)
    unloaded = httpx.post(f"{embedded_triton.http_url}/v2/repository/models/{embedded_triton.model}/unload",
                          headers={ADMIN_HEADER: embedded_triton.admin_key}, json={})
    assert unloaded.status_code == 200
    t0 = time.monotonic()
    while not embedded_triton.admin.model_ready(embedded_triton.model):
        assert time.monotonic() - t0 < 10, "the supervisor never loaded the model again"
        time.sleep(0.05)
    assert embedded_triton.admin.probe_inference(embedded_triton.model, timeout=10) is None


def test_reranker_embedded_is_supervised_too(prepared_models):
    from keyrank.config import Settings
    from keyrank.errors import ScoringUnavailable
    from keyrank.reranker import Reranker

    with Reranker.embedded(Settings(model_dir=prepared_models)) as reranker:
        assert reranker.rank(BODY["query"], BODY["documents"]).results[0].index == 0
        triton = reranker._embedded
        (stub,) = stubs_of(triton.pid)
        os.kill(stub, signal.SIGKILL)
        killed = time.monotonic()
        while True:
            try:
                ranking = reranker.rank(BODY["query"], BODY["documents"])
                if time.monotonic() - killed > 0.5:  # not a request that raced the kill
                    break
            except ScoringUnavailable:  # the outage is a 503, never another error
                assert time.monotonic() - killed < 10, "Reranker.embedded() never recovered from a killed model process"
                time.sleep(0.1)
        assert ranking.results[0].index == 0
        assert time.monotonic() - killed < 10
        assert [how for how, _ in triton.supervisor.repairs] == ["model reload"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_guard_fails_liveness_when_the_model_process_dies_and_not_before(prepared_models):
    # Kubernetes: the chart points Triton's liveness probe at the guard, whose answer follows the
    # model path; Triton's own /v2/health/live stays 200 with a dead stub.
    from keyrank.config import Settings
    from keyrank.modelserver.guard import ModelPathCheck
    from keyrank.modelserver.admin import TritonAdmin
    from keyrank.modelserver.embedded import EmbeddedTriton

    with EmbeddedTriton(settings=Settings(model_dir=prepared_models), supervise=False) as triton:
        check = ModelPathCheck(TritonAdmin(triton.http_url), triton.model, every_s=0.1,
                               probe_every_s=0.5, probe_timeout_s=5.0, hang_after_s=30.0)
        with guard_serving(check) as guard:
            wait_status(guard, "/v2/health/live", 200, timeout=10)
            (stub,) = stubs_of(triton.pid)
            os.kill(stub, signal.SIGKILL)
            took = wait_status(guard, "/v2/health/live", 503, timeout=5)
            assert httpx.get(f"{triton.http_url}/v2/health/live").status_code == 200  # Triton's own probe is blind
            assert "Stub process" in httpx.get(f"{guard}/v2/health/live").json()["error"]
            assert took < 3.0


def _supervised_by(triton, **timing):
    from keyrank.modelserver.supervision import Supervisor

    supervisor = Supervisor(triton, tick_s=0.05, probe_every_s=0.2, **timing)
    triton.supervisor = supervisor
    supervisor.start()
    return supervisor


def test_a_busy_model_whose_probes_time_out_is_not_taken_for_a_hung_one(prepared_models):
    # Under load the probe queues behind big batches and times out, yet executions keep finishing:
    # reloading the model then would only throw its queue away (seen under a CPU-bound eval).
    import threading

    from keyrank.config import Settings
    from keyrank.modelserver.embedded import EmbeddedTriton

    # At the gateway's niceness: niced, the model's executions stall whenever other work on the host wants
    # the cores, which is not what this test is about.
    with EmbeddedTriton(settings=Settings(model_dir=prepared_models, embedded_nice=0), supervise=False) as triton:
        rows, length = 4, 256
        batch = {"inputs": [{"name": name, "shape": [rows, length], "datatype": "INT64", "data": [1] * (rows * length)}
                            for name in ("input_ids", "attention_mask", "token_type_ids")]}
        stop_load = threading.Event()

        def load() -> None:
            with httpx.Client(timeout=60) as client:
                while not stop_load.is_set():
                    assert client.post(f"{triton.http_url}/v2/models/{triton.model}/infer", json=batch).status_code == 200

        # "Hung" means no execution finished for hang_after_s: it must exceed one execution's time here, which
        # a loaded machine stretches (at load 10 on 2 cores a batch took longer than a fixed 1.5 s). The two
        # loaders' requests are merged by the batcher into one execution of twice the rows: timed as such
        # (timing one loader's batch, a busy machine made an 8-row execution outlast 5x a 4-row one).
        merged = {"inputs": [{**tensor, "shape": [2 * rows, length], "data": [1] * (2 * rows * length)}
                             for tensor in batch["inputs"]]}
        slowest = 0.0
        with httpx.Client(timeout=60) as client:
            for _ in range(3):
                started = time.monotonic()
                assert client.post(f"{triton.http_url}/v2/models/{triton.model}/infer", json=merged).status_code == 200
                slowest = max(slowest, time.monotonic() - started)
        hang_after_s = max(1.5, 5 * slowest)
        loaders = [threading.Thread(target=load, daemon=True) for _ in range(2)]
        for loader in loaders:
            loader.start()
        supervisor = _supervised_by(triton, probe_timeout_s=0.01, hang_after_s=hang_after_s)
        try:
            time.sleep(max(6.0, 3 * hang_after_s))
        finally:
            stop_load.set()
            supervisor.stop()
            for loader in loaders:
                loader.join(60)
        clock = supervisor._prober.hang
        assert clock.timeouts >= 5, "the probes never timed out behind the load: this test tested nothing"
        assert supervisor.repairs == [] and supervisor.failure is None, supervisor.repairs
        assert clock.busy_timeouts >= 5


def test_a_model_process_that_stops_executing_is_declared_hung_and_repaired(prepared_models):
    from keyrank.config import Settings
    from keyrank.modelserver.embedded import EmbeddedTriton

    with EmbeddedTriton(settings=Settings(model_dir=prepared_models), supervise=False) as triton:
        (stub,) = stubs_of(triton.pid)
        # SIGSTOP stands in for a deadlock: alive, answers nothing. A stopped stub is otherwise killed at
        # once (stopped_after_s); here only the hang clock may notice it.
        supervisor = _supervised_by(triton, probe_timeout_s=0.3, hang_after_s=1.5, stopped_after_s=None)
        os.kill(stub, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            while not supervisor.repairs:
                assert time.monotonic() - stopped < 60, f"not repaired; failure: {supervisor.failure}"
                time.sleep(0.1)
        finally:
            supervisor.stop()
            if alive(stub):
                os.kill(stub, signal.SIGCONT)
        assert time.monotonic() - stopped > 1.5  # not before hang_after_s
        assert triton.admin.probe_inference(triton.model, timeout=10) is None


def test_a_fault_seen_on_a_server_that_a_restart_replaced_leaves_its_successor_serving(prepared_models):
    # CI saw it: a test killed and restarted the session's Triton while the supervisor repaired a fault it had
    # seen on the old server; its unload reached the new server, and requests found "unknown model".
    import threading

    from keyrank.config import Settings
    from keyrank.modelserver.embedded import EmbeddedTriton
    from keyrank.modelserver.supervision import Fault, Repair, Supervisor

    with EmbeddedTriton(settings=Settings(model_dir=prepared_models), supervise=False) as triton:
        supervisor = Supervisor(triton, tick_s=0.05, probe_every_s=60.0)  # not started: the test drives it
        old = triton.pid
        landed = []  # the server each unload reached
        restarted = threading.Event()
        unload = triton.admin.unload

        def unload_after_the_restart(model):
            restarted.wait(60)  # as if the request were slow: it lands once the restart is done
            landed.append(triton.pid)
            return unload(model)

        triton.admin.unload = unload_after_the_restart
        fault = Fault(Repair.RELOAD, "model process died (Python backend stub pid 1)", (triton.model,), server_pid=old)
        with triton.lifecycle:  # an operator's restart, begun after the fault was seen
            repair = threading.Thread(target=supervisor.repair, args=(fault,))
            repair.start()
            time.sleep(0.3)  # the repair has read which server it repairs
            triton.restart_locked(120)
            restarted.set()
        repair.join(60)
        triton.admin.unload = unload
        assert not repair.is_alive()
        assert triton.pid != old
        assert old not in landed and triton.pid not in landed, landed  # nothing unloaded the successor's model
        assert triton.admin.model_ready(triton.model)
        assert triton.admin.probe_inference(triton.model, timeout=10) is None
        assert supervisor.repairs == []  # the successor needed no repair

        # A probe that failed on the old server (unreachable while it stopped) blames nothing on its successor;
        # the same failure seen on the server that runs is a fault.
        supervisor._prober.last_error = (time.monotonic(), "unreachable", (triton.model,), old)
        assert supervisor.diagnose() is None
        supervisor._prober.last_error = (time.monotonic(), "unreachable", (triton.model,), triton.pid)
        assert supervisor.diagnose() is not None
