"""The gateway's shutdown grace is one setting (KEYRANK_SHUTDOWN_GRACE_S) that the Helm chart sets,
and Kubernetes waits longer than it (plus the preStop sleep) before its SIGKILL."""

from __future__ import annotations

import subprocess

import pytest
from test_deploy import CHART, KUBE_VERSION, helm, render  # noqa: F401 -- helm is a fixture

PRESTOP_S = 5


def _gateway(objects: list[dict]) -> dict:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("gateway")]
    return deployment["spec"]["template"]["spec"]


def test_the_chart_gives_the_gateway_more_than_its_shutdown_grace_before_sigkill(helm):  # noqa: F811
    pod = _gateway(render(helm))
    (gateway,) = [c for c in pod["containers"] if c["name"] == "gateway"]
    env = {e["name"]: e.get("value") for e in gateway["env"]}
    grace = float(env["KEYRANK_SHUTDOWN_GRACE_S"])
    assert grace >= float(env["KEYRANK_REQUEST_TIMEOUT_S"])  # no request within its deadline is cut
    assert pod["terminationGracePeriodSeconds"] > PRESTOP_S + grace


def test_the_chart_refuses_a_grace_period_that_kubernetes_would_cut_short(helm):  # noqa: F811
    result = subprocess.run(
        [helm, "template", "keyrank", str(CHART), "--kube-version", KUBE_VERSION, "--set", "gateway.shutdownGraceSeconds=40"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode != 0
    assert "must exceed the preStop sleep" in result.stderr


def test_the_shutdown_grace_is_a_setting():
    from keyrank.config import Settings

    assert Settings(shutdown_grace_s=3).shutdown_grace_s == 3
    with pytest.raises(ValueError):
        Settings(shutdown_grace_s=0)
