"""The chart's probes watch the model path, as the embedded supervisor does: Triton's liveness
asks the model guard (whose answer follows a real inference), and readiness of Triton and the
gateway is checked every second so a broken model path leaves the Service within ~1 s."""

from __future__ import annotations

from test_deploy import container, helm, one, render  # noqa: F401 -- helm is the fixture

GUARD_PORT = 8003


def test_triton_liveness_asks_the_model_guard_which_checks_triton_on_loopback(helm):  # noqa: F811
    triton = one(render(helm), "Deployment", "-triton")
    main, guard = container(triton, "triton"), container(triton, "model-guard")
    assert main["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": GUARD_PORT}
    assert guard["args"][0] == "guard"
    assert f"--port={GUARD_PORT}" in guard["args"] and "--triton-http=http://127.0.0.1:8000" in guard["args"]
    assert {"name": "guard", "containerPort": GUARD_PORT, "protocol": "TCP"} in guard["ports"]
    # A restart within seconds of the model path breaking, not minutes.
    liveness = main["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] <= 5


def test_without_the_guard_triton_liveness_falls_back_to_its_own_endpoint(helm):  # noqa: F811
    triton = one(render(helm, sets=("triton.guard.enabled=false",)), "Deployment", "-triton")
    assert [c["name"] for c in triton["spec"]["template"]["spec"]["containers"]] == ["triton"]
    assert container(triton, "triton")["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}


def test_readiness_of_gateway_and_triton_reacts_within_a_second_or_two(helm):  # noqa: F811
    objects = render(helm)
    for workload, name in (("-gateway", "gateway"), ("-triton", "triton")):
        readiness = container(one(objects, "Deployment", workload), name)["readinessProbe"]
        assert readiness["periodSeconds"] == 1 and readiness["failureThreshold"] == 1, name
