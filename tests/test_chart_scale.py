"""The chart past one machine: every Triton replica carries traffic, a lost one costs seconds, the switches
switch, the GPU pool's settings exist, autoscaling and alerts ship, and a model upgrade never serves the old
model. `helm template` renders each case; core objects are checked against the Kubernetes schemas
(kubernetes-validate --strict), the CRD-based ones (PrometheusRule, ServiceMonitor, ScaledObject) against
strict schemas of the fields their CRDs define."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from test_deploy import (  # noqa: F401 -- helm is a fixture
    CHART,
    GPU_VALUES,
    KUBE_VERSION,
    MONITORING_APIS,
    ROOT,
    container,
    find,
    helm,
    one,
    pod_labels,
    pod_spec,
    render,
    selects,
)

NAMESPACE = "search"
HEADLESS = "keyrank-triton-grpc"
KEDA = "keda.sh/v1alpha1/ScaledObject"
PYTRITON_SERVER = ROOT / ".venv" / "lib" / "python3.11" / "site-packages" / "pytriton" / "tritonserver" / "bin" / "tritonserver"
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]


def validate(objects: list[dict]) -> None:
    """kubernetes-validate --strict for the core objects, the strict CRD schemas below for the others."""
    import jsonschema
    import kubernetes_validate

    errors = []
    for obj in objects:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in CRD_SCHEMAS:
            for error in jsonschema.Draft7Validator(CRD_SCHEMAS[obj["kind"]]).iter_errors(obj):
                errors.append(f"{where}: {error.message} at {list(error.path)}")
            continue
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            errors.append(f"{where}: {error.message} at {list(error.path)}")
    assert not errors, "\n".join(errors)


def template(helm: str, *args: str) -> subprocess.CompletedProcess:  # noqa: F811
    return subprocess.run([helm, "template", "keyrank", str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION, *args],
                          capture_output=True, text=True, timeout=60)


def env_of(workload: dict, name: str) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container(workload, name).get("env", [])}


def flags(args: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in args if a.startswith("--") and "=" in a)


def component(obj: dict) -> str | None:
    return obj["metadata"]["labels"].get("app.kubernetes.io/component")


# --- strict schemas of the CRD objects the chart renders ----------------------------------------

_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?)$"}
_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_META = {"type": "object", "required": ["name", "labels"],
         "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}, "labels": _STR_MAP, "annotations": _STR_MAP}}


def _crd(kind: str, api: str, spec: dict) -> dict:
    return {"type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {"apiVersion": {"const": api}, "kind": {"const": kind}, "metadata": _META, "spec": spec}}


def _object(properties: dict, required: tuple = ()) -> dict:
    return {"type": "object", "additionalProperties": False, "properties": properties, "required": list(required)}


_SELECTOR = _object({"matchLabels": _STR_MAP, "matchExpressions": {"type": "array", "items": _object(
    {"key": {"type": "string"}, "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
     "values": {"type": "array", "items": {"type": "string"}}}, ("key", "operator"))}})
CRD_SCHEMAS = {
    # monitoring.coreos.com/v1 (prometheus-operator's CRDs: the fields of a rule and of an endpoint the chart uses)
    "PrometheusRule": _crd("PrometheusRule", "monitoring.coreos.com/v1", _object({"groups": {"type": "array", "minItems": 1, "items": _object({
        "name": {"type": "string", "minLength": 1}, "interval": _DURATION,
        "rules": {"type": "array", "minItems": 1, "items": _object({
            "alert": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}, "expr": {"type": "string", "minLength": 1},
            "for": _DURATION, "labels": _STR_MAP, "annotations": _STR_MAP}, ("alert", "expr", "labels", "annotations"))}},
        ("name", "rules"))}}, ("groups",))),
    "ServiceMonitor": _crd("ServiceMonitor", "monitoring.coreos.com/v1", _object({
        "selector": _SELECTOR, "endpoints": {"type": "array", "minItems": 1, "items": _object({
            "port": {"type": "string"}, "path": {"type": "string"}, "interval": _DURATION, "scrapeTimeout": _DURATION}, ("port",))}},
        ("selector", "endpoints"))),
    # keda.sh/v1alpha1 ScaledObject
    "ScaledObject": _crd("ScaledObject", "keda.sh/v1alpha1", _object({
        "scaleTargetRef": _object({"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "name": {"type": "string"}}, ("name",)),
        "minReplicaCount": {"type": "integer", "minimum": 0}, "maxReplicaCount": {"type": "integer", "minimum": 1},
        "pollingInterval": {"type": "integer"}, "cooldownPeriod": {"type": "integer"},
        "advanced": _object({"horizontalPodAutoscalerConfig": _object({"name": {"type": "string"}, "behavior": {"type": "object"}})}),
        "triggers": {"type": "array", "minItems": 1, "items": _object({
            "type": {"type": "string"}, "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
            "metadata": _STR_MAP, "authenticationRef": _object({"name": {"type": "string"}, "kind": {"type": "string"}}, ("name",))},
            ("type", "metadata"))}}, ("scaleTargetRef", "triggers"))),
}


def promql_well_formed(expr: str) -> None:
    """What can be checked without Prometheus: strings end, brackets balance, every selector's matchers parse,
    every range is a duration."""
    stripped = re.sub(r'"(?:[^"\\]|\\.)*"', '"s"', expr)
    assert '"' not in stripped.replace('"s"', ""), f"unterminated string in {expr}"
    stack, pairs = [], {")": "(", "]": "[", "}": "{"}
    for ch in stripped:
        if ch in "([{":
            stack.append(ch)
        elif ch in ")]}":
            assert stack and stack.pop() == pairs[ch], expr
    assert not stack, expr
    for selector in re.findall(r"\{([^{}]*)\}", stripped):
        for matcher in selector.split(","):
            assert re.fullmatch(r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=~|!~|!=|=)\s*"s"\s*', matcher), (matcher, expr)
    for window in re.findall(r"\[([^\]]*)\]", stripped):
        assert re.fullmatch(r"[0-9]+[smh]", window), f"range [{window}] in {expr}"


def seconds(duration: str) -> int:
    return int(duration[:-1]) * {"s": 1, "m": 60, "h": 3600}[duration[-1]]


# --- item 1: every replica carries traffic, a lost one costs seconds ----------------------------


@pytest.fixture(scope="module")
def gpu(helm) -> list[dict]:  # noqa: F811
    return render(helm, GPU_VALUES)


@pytest.fixture(scope="module")
def default(helm) -> list[dict]:  # noqa: F811
    return render(helm)


def test_a_headless_service_lists_every_ready_triton_pod_for_grpc(default, gpu):
    for objects in (default, gpu):
        validate(objects)
        triton = one(objects, "Deployment", "-triton")
        headless = one(objects, "Service", "-triton-grpc")
        assert headless["spec"]["clusterIP"] == "None"
        assert headless["spec"].get("publishNotReadyAddresses", False) is False  # not-ready pods are not dialled
        assert headless["spec"]["ports"] == [{"name": "grpc", "port": 8001, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "grpc"}]
        assert selects({"matchLabels": headless["spec"]["selector"]}, pod_labels(triton))
        # The ClusterIP Service stays for HTTP, metrics and a mesh's gRPC.
        clusterip = one(objects, "Service", "-triton")
        assert "clusterIP" not in clusterip["spec"] and {p["name"] for p in clusterip["spec"]["ports"]} == {"http", "grpc", "metrics"}


def test_the_gateway_balances_over_the_headless_service_with_keepalive_and_no_flag(gpu):
    gateway = one(gpu, "Deployment", "-gateway")
    env = env_of(gateway, "gateway")
    assert env["KEYRANK_TRITON_URL"] == f"dns:///{HEADLESS}.{NAMESPACE}.svc.cluster.local:8001"
    assert env["KEYRANK_TRITON_BALANCING"] == "round_robin"
    assert float(env["KEYRANK_TRITON_KEEPALIVE_S"]) == 5 and float(env["KEYRANK_TRITON_KEEPALIVE_TIMEOUT_S"]) == 5
    # A lost node noticed within the keepalive (target <= 15 s), not TCP's ~15 minutes.
    assert float(env["KEYRANK_TRITON_KEEPALIVE_S"]) + float(env["KEYRANK_TRITON_KEEPALIVE_TIMEOUT_S"]) <= 15
    args = container(gateway, "gateway")["args"]
    assert args == ["serve"] and not any(a.startswith("--triton-url") for a in args)
    assert [e["name"] for e in container(gateway, "gateway")["env"]].count("KEYRANK_TRITON_URL") == 1


def test_with_a_mesh_pick_first_dials_the_clusterip_service(helm):  # noqa: F811
    objects = render(helm, sets=("gateway.tritonBalancing=pick_first",))
    env = env_of(one(objects, "Deployment", "-gateway"), "gateway")
    assert env["KEYRANK_TRITON_URL"] == f"dns:///keyrank-triton.{NAMESPACE}.svc.cluster.local:8001"
    assert env["KEYRANK_TRITON_BALANCING"] == "pick_first"
    bad = template(helm, "--set", "gateway.tritonBalancing=least_request")
    assert bad.returncode != 0 and "tritonBalancing" in bad.stderr


def test_the_chart_refuses_a_gateway_env_that_duplicates_what_it_derives(helm):  # noqa: F811
    result = template(helm, "--set", "gateway.env.KEYRANK_TRITON_URL=other:8001")
    assert result.returncode != 0 and "gateway.env.KEYRANK_TRITON_URL is set by the chart" in result.stderr


def test_triton_accepts_the_gateways_pings_and_ages_connections(default, helm):  # noqa: F811
    for objects in (default, render(helm, sets=("gateway.tritonKeepaliveSeconds=2",))):
        keepalive_ms = float(env_of(one(objects, "Deployment", "-gateway"), "gateway")["KEYRANK_TRITON_KEEPALIVE_S"]) * 1000
        args = flags(container(one(objects, "Deployment", "-triton"), "triton")["args"])
        assert args["--grpc-keepalive-permit-without-calls"] == "1"
        assert args["--grpc-http2-max-pings-without-data"] == "0"
        assert args["--grpc-http2-max-ping-strikes"] == "0"
        # Pings as often as the gateway sends them are never "too many".
        assert 0 < int(args["--grpc-http2-min-recv-ping-interval-without-data"]) < keepalive_ms
        assert int(args["--grpc-keepalive-time"]) > 0 and int(args["--grpc-keepalive-timeout"]) > 0
        # Connections aged out so gateways re-resolve DNS and find pods added later, with a grace for calls in flight.
        assert 0 < int(args["--grpc-max-connection-age"]) <= 120_000
        assert 0 < int(args["--grpc-max-connection-age-grace"]) <= int(args["--grpc-max-connection-age"])


def test_the_pinned_triton_release_knows_every_flag_the_chart_gives_it(default, helm):  # noqa: F811
    """The nvidia-pytriton 0.7 wheel's tritonserver is Triton 2.51, the server of the NGC 24.10 image the chart pins
    (docker/triton-cpu's Dockerfile says so): every flag of either chart Triton is one it accepts."""
    if not PYTRITON_SERVER.exists():
        pytest.skip(f"no tritonserver at {PYTRITON_SERVER} (the nvidia-pytriton wheel)")
    assert one(default, "Deployment", "-triton")["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":24.10-py3")
    assert "Triton 2.51" in (ROOT / "docker" / "triton-cpu" / "Dockerfile").read_text()
    known = set(re.findall(r"^\s+(--[a-z0-9-]+)", subprocess.run([str(PYTRITON_SERVER), "--help"], capture_output=True, text=True).stdout
                           + subprocess.run([str(PYTRITON_SERVER), "--help"], capture_output=True, text=True).stderr, re.MULTILINE))
    assert "--grpc-max-connection-age" in known
    cpu = render(helm, sets=("triton.gpu.enabled=false",))
    for objects in (default, cpu):
        given = {arg.split("=", 1)[0] for arg in container(one(objects, "Deployment", "-triton"), "triton")["args"]}
        assert {"--grpc-max-connection-age", "--grpc-http2-min-recv-ping-interval-without-data", "--exit-timeout-secs"} <= given
        assert given <= known, given - known


def _free_ports(count: int) -> list[int]:
    import socket

    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


@pytest.mark.triton
def test_the_pinned_triton_release_starts_with_the_charts_arguments_and_drains_on_sigterm(gpu, tmp_path):
    """Not only the names: the values parse, the server comes up live with them (an empty repository, on loopback
    ports of this machine) and SIGTERM starts the drain the chart's --exit-timeout-secs bounds."""
    import time
    import urllib.request

    if not PYTRITON_SERVER.exists():
        pytest.skip(f"no tritonserver at {PYTRITON_SERVER} (the nvidia-pytriton wheel)")
    (tmp_path / "repository").mkdir()
    http, grpc, metrics = _free_ports(3)
    local = {"--model-repository": tmp_path / "repository", "--http-port": http, "--grpc-port": grpc, "--metrics-port": metrics,
             "--allow-gpu-metrics": "false"}
    args = [f"{a.split('=', 1)[0]}={local[a.split('=', 1)[0]]}" if a.split("=", 1)[0] in local else a
            for a in container(one(gpu, "Deployment", "-triton"), "triton")["args"]]
    args += ["--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1"]
    log = tmp_path / "tritonserver.log"
    with log.open("w") as out:
        server = subprocess.Popen([str(PYTRITON_SERVER), *args], stdout=out, stderr=subprocess.STDOUT)
    try:
        live = False
        for _ in range(120):
            if server.poll() is not None:
                break
            try:
                live = urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/live", timeout=1).status == 200
            except OSError:
                time.sleep(0.25)
            if live:
                break
        assert live, log.read_text()[-3000:]
    finally:
        server.terminate()
        server.wait(timeout=30)
    text = log.read_text()
    assert "Started GRPCInferenceService" in text and "Waiting for in-flight requests to complete" in text
    exit_timeout = flags(container(one(gpu, "Deployment", "-triton"), "triton")["args"])["--exit-timeout-secs"]
    assert f"Timeout {exit_timeout}:" in text


def test_triton_leaves_the_endpoints_then_drains_before_the_kubelet_kills_it(default, helm):  # noqa: F811
    triton = one(default, "Deployment", "-triton")
    main = container(triton, "triton")
    sleep = main["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep" and int(sleep[1]) >= 5
    exit_timeout = int(flags(main["args"])["--exit-timeout-secs"])
    assert int(sleep[1]) + exit_timeout < pod_spec(triton)["terminationGracePeriodSeconds"]
    result = template(helm, "--set", "triton.exitTimeoutSeconds=55")
    assert result.returncode != 0 and "must exceed triton.preStopSleepSeconds" in result.stderr


# --- item 4: switches that switch -------------------------------------------------------------


def test_an_external_triton_renders_no_triton_object_and_is_what_the_gateway_dials(helm):  # noqa: F811
    url = "dns:///triton-grpc.ml.svc.cluster.local:8001"
    for values in ((), (GPU_VALUES,)):
        objects = render(helm, *values, sets=("triton.enabled=false", f"triton.url={url}"))
        validate(objects)
        assert not [o for o in objects if component(o) == "triton"], [o["metadata"]["name"] for o in objects if component(o) == "triton"]
        assert not [o for o in objects if "-triton" in o["metadata"]["name"]]
        gateway = one(objects, "Deployment", "-gateway")
        assert env_of(gateway, "gateway")["KEYRANK_TRITON_URL"] == url
        # The gateway still gets its model assets (tokenizer, head) from the export.
        assert pod_spec(gateway)["initContainers"]
    missing = template(helm, "--set", "triton.enabled=false")
    assert missing.returncode != 0 and "triton.enabled=false needs triton.url" in missing.stderr
    stray = template(helm, "--set", f"triton.url={url}")
    assert stray.returncode != 0 and "set triton.enabled=false as well" in stray.stderr


def test_a_cpu_triton_serves_the_cpu_image_and_the_embedded_repository(helm):  # noqa: F811
    dockerfile = (ROOT / "docker" / "triton-cpu" / "Dockerfile").read_text()
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (\[.*?\])$", dockerfile.replace("\\\n", ""), re.MULTILINE | re.DOTALL).group(1))
    for values in ((), (GPU_VALUES,)):
        objects = render(helm, *values, sets=("triton.gpu.enabled=false",))
        validate(objects)
        triton = one(objects, "Deployment", "-triton")
        spec, main = pod_spec(triton), container(triton, "triton")
        assert main["image"] == f"ghcr.io/keyrank/keyrank-triton-cpu:{APP_VERSION}"
        assert main["command"] == ["tritonserver"]
        # What the CPU image's own entrypoint gives the server (the chart replaces the entrypoint).
        for arg in entrypoint[1:]:
            if arg.startswith(("--http-port", "--grpc-port", "--metrics-port", "--exit-timeout-secs")):
                continue
            assert arg in main["args"], arg
        assert "--model-repository=/models/triton-embedded" in main["args"]
        assert "--allow-gpu-metrics=false" in main["args"]
        # No GPU anywhere: no request, toleration, node selector or runtime class (values-gpu's pool is for GPUs).
        assert "nvidia" not in json.dumps(spec) and "gke-accelerator" not in json.dumps(spec)
        assert "runtimeClassName" not in spec
        # The Python backend's stub processes are reaped by the pause process (no init in the image).
        assert spec["shareProcessNamespace"] is True
        # Its model's threads sized from the pod's CPU request, not the node's cores.
        cores = next(e for e in main["env"] if e["name"] == "KEYRANK_USABLE_CORES")
        assert cores["valueFrom"]["resourceFieldRef"] == {"containerName": "triton", "resource": "requests.cpu", "divisor": "1"}
        wait = [c for c in spec["initContainers"] if c["name"] == "wait-for-models"]
        for c in wait:
            assert "/triton-embedded ]" in c["command"][2] and "/triton ]" not in c["command"][2]


def test_a_cpu_triton_with_several_models_builds_its_repository_from_triton_embedded(helm, tmp_path):  # noqa: F811
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"models": {"served": [{"name": "base", "model": "m"}]}, "triton": {"gpu": {"enabled": False}}}))
    triton = one(render(helm, values), "Deployment", "-triton")
    script = next(c for c in pod_spec(triton)["initContainers"] if c["name"] == "model-repository")["command"][2]
    assert "/models/base/triton-embedded/cross_encoder/config.pbtxt" in script and "/triton/" not in script
    assert "--model-repository=/repository" in container(triton, "triton")["args"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--set", "gateway.tritonBalancng=round_robin"), "Additional property tritonBalancng is not allowed"),
        (("--set", "tritn.enabled=false"), "Additional property tritn is not allowed"),
        (("--set", "triton.gpu.enabeld=false"), "Additional property enabeld is not allowed"),
        (("--set", "triton.replicas=two"), "triton.replicas: Invalid type. Expected: integer"),
        (("--set-string", "triton.enabled=no"), "triton.enabled: Invalid type. Expected: boolean"),
        (("--set", "models.pvc.keepExports=0"), "keepExports"),
        (("--set", "serviceMonitor.interval=15"), "serviceMonitor.interval"),
    ],
)
def test_the_values_schema_refuses_unknown_keys_and_mistyped_values(helm, args, said):  # noqa: F811
    assert (CHART / "values.schema.json").exists()
    rendered = template(helm, *args)
    assert rendered.returncode != 0 and said in rendered.stderr, rendered.stderr
    linted = subprocess.run([helm, "lint", str(CHART), "--strict", *args], capture_output=True, text=True, timeout=60)
    assert linted.returncode != 0 and said in linted.stdout + linted.stderr


def test_the_values_schema_refuses_a_typo_in_a_values_file(helm, tmp_path):  # noqa: F811
    values = tmp_path / "values.yaml"
    values.write_text("triton:\n  gpu:\n    enabled: false\n  nodeSelectr: {pool: cpu}\n")
    result = template(helm, "-f", str(values))
    assert result.returncode != 0 and "nodeSelectr" in result.stderr


# --- item 7: the GPU pool -----------------------------------------------------------------------


def test_gpu_pool_settings_runtime_class_priority_zone_spread_and_eviction(helm, default, gpu):  # noqa: F811
    objects = render(helm, GPU_VALUES, sets=("triton.gpu.runtimeClassName=nvidia", "triton.priorityClassName=gpu-serving",
                                             "gateway.priorityClassName=search"))
    validate(objects)
    triton, gateway = one(objects, "Deployment", "-triton"), one(objects, "Deployment", "-gateway")
    assert pod_spec(triton)["runtimeClassName"] == "nvidia"
    assert pod_spec(triton)["priorityClassName"] == "gpu-serving" and pod_spec(gateway)["priorityClassName"] == "search"
    for objs in (default, gpu):
        spread = pod_spec(one(objs, "Deployment", "-triton"))["topologySpreadConstraints"]
        zone = next(c for c in spread if c["topologyKey"] == "topology.kubernetes.io/zone")
        assert selects(zone["labelSelector"], pod_labels(one(objs, "Deployment", "-triton"))) and zone["maxSkew"] == 1
    annotation = "cluster-autoscaler.kubernetes.io/safe-to-evict"
    assert one(gpu, "Deployment", "-triton")["spec"]["template"]["metadata"]["annotations"][annotation] == "true"
    assert annotation not in one(default, "Deployment", "-triton")["spec"]["template"]["metadata"].get("annotations", {})
    pinned = one(render(helm, sets=("triton.safeToEvict=false",)), "Deployment", "-triton")
    assert pinned["spec"]["template"]["metadata"]["annotations"][annotation] == "false"


def test_the_driver_floor_of_the_pinned_triton_release_is_documented():
    values = (CHART / "values.yaml").read_text()
    image = values[values.index("  image:\n    # -- GPU Triton image"):values.index("tag: 24.10-py3")]
    assert "driver >= 560" in image and "535.86" in image
    assert "535.86" in (ROOT / "k8s" / "README.md").read_text()


def _mebibytes(quantity: str) -> float:
    number, unit = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", quantity).groups()
    return float(number) * {"Mi": 1, "Gi": 1024, "M": 1e6 / 2**20, "G": 1e9 / 2**20}[unit]


def test_the_guard_has_room_under_its_memory_limit(default):
    guard = container(one(default, "Deployment", "-triton"), "model-guard")
    # ~115 MiB resident: an OOM kill fails Triton's liveness and restarts Triton, so at least 2x.
    assert _mebibytes(guard["resources"]["limits"]["memory"]) >= 230
    assert _mebibytes(guard["resources"]["requests"]["memory"]) >= 115


# --- item 6: autoscaling and alerts shipped ----------------------------------------------------


def test_prometheus_adapter_rules_are_rendered_with_windows_of_four_scrapes(gpu, helm):  # noqa: F811
    configmap = one(gpu, "ConfigMap", "-prometheus-adapter")
    assert configmap["metadata"]["namespace"] == "monitoring"
    rules = yaml.safe_load(configmap["data"]["config.yaml"])["rules"]
    names = {r["name"]["as"] for r in rules}
    hpa = one(gpu, "HorizontalPodAutoscaler", "-triton")
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] in names and "keyrank_requests_per_second" in names
    scrape = seconds(one(gpu, "ServiceMonitor", "-triton")["spec"]["endpoints"][0]["interval"])
    for rule in rules:
        windows = re.findall(r"\[([0-9]+[smh])\]", rule["metricsQuery"])
        assert windows and all(seconds(w) >= 4 * scrape for w in windows), rule["metricsQuery"]
        assert "<<.LabelMatchers>>" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]
    # The window follows the scrape interval, and one under 4 intervals is refused.
    slow = one(render(helm, GPU_VALUES, sets=("serviceMonitor.interval=30s",)), "ConfigMap", "-prometheus-adapter")
    assert "[120s]" in slow["data"]["config.yaml"]
    short = template(helm, "-f", str(GPU_VALUES), "--set", "autoscaling.window=30s")
    assert short.returncode != 0 and "under 4 scrape intervals" in short.stderr


def test_both_autoscalers_say_how_fast_they_scale_up(default, gpu):
    for hpa in (one(default, "HorizontalPodAutoscaler", "-gateway"), one(gpu, "HorizontalPodAutoscaler", "-triton")):
        up = hpa["spec"]["behavior"]["scaleUp"]
        assert up["policies"] and "stabilizationWindowSeconds" in up, hpa["metadata"]["name"]
        assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 300


def test_keda_owns_triton_scaling_when_chosen_and_its_crd_is_there(helm):  # noqa: F811
    sets = ("autoscaling.provider=keda",)
    objects = render(helm, GPU_VALUES, sets=sets, apis=MONITORING_APIS + (KEDA,))
    validate(objects)
    scaled = one(objects, "ScaledObject", "-triton")
    assert scaled["spec"]["scaleTargetRef"]["name"] == one(objects, "Deployment", "-triton")["metadata"]["name"]
    assert not find(objects, "HorizontalPodAutoscaler", "-triton")  # KEDA makes its own
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "Value"
    query = trigger["metadata"]["query"]
    promql_well_formed(query)
    assert f'namespace="{NAMESPACE}"' in query and 'pod=~"keyrank-triton-[a-z0-9]+-[a-z0-9]+"' in query
    assert all(seconds(w) >= 60 for w in re.findall(r"\[([0-9]+[smh])\]", query))
    assert scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleUp"]["policies"]
    missing = template(helm, "-f", str(GPU_VALUES), "--set", "autoscaling.provider=keda")
    assert missing.returncode != 0 and "needs KEDA's ScaledObject CRD" in missing.stderr


ALERTS = {"KeyrankTritonQueueTimeHigh", "KeyrankTritonImbalance", "KeyrankTritonPodIdle", "KeyrankTritonMetricsAbsent",
          "KeyrankGatewayMetricsAbsent", "KeyrankTritonErrors", "KeyrankGatewayTritonErrors", "KeyrankTritonRestarted",
          "KeyrankModelGuardRestarted", "KeyrankReadinessFlapping"}


def test_alerts_ship_as_a_prometheus_rule_where_the_crd_is_served(gpu, helm):  # noqa: F811
    validate(gpu)
    rule = one(gpu, "PrometheusRule", "keyrank")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert ALERTS <= set(alerts)
    for name, alert in alerts.items():
        promql_well_formed(alert["expr"])
        assert f'namespace="{NAMESPACE}"' in alert["expr"], name  # this release's pods only
        assert alert["labels"]["severity"] in {"info", "warning", "critical"} and alert["annotations"]["summary"], name
        for window in re.findall(r"\[([0-9]+[smh])\]", alert["expr"]):
            assert seconds(window) >= 60, (name, window)  # 4 scrapes of 15 s at least
    assert "by (namespace, pod)" in alerts["KeyrankTritonQueueTimeHigh"]["expr"] and "> 20000" in alerts["KeyrankTritonQueueTimeHigh"]["expr"]
    assert "absent(nv_inference_queue_duration_us" in alerts["KeyrankTritonMetricsAbsent"]["expr"]
    assert 'container="model-guard"' in alerts["KeyrankModelGuardRestarted"]["expr"]
    assert "kube_pod_status_ready" in alerts["KeyrankReadinessFlapping"]["expr"]
    # Alert templates reach Prometheus as Prometheus templates, not expanded (or broken) by Helm.
    assert "{{ $labels.pod }}" in alerts["KeyrankTritonQueueTimeHigh"]["annotations"]["summary"]
    # No CRD, no object (and no failed install); without Triton, no Triton alerts.
    assert not find(render(helm, GPU_VALUES, apis=()), "PrometheusRule")
    external = render(helm, GPU_VALUES, sets=("triton.enabled=false", "triton.url=t:8001"))
    assert {r["alert"] for g in one(external, "PrometheusRule", "keyrank")["spec"]["groups"] for r in g["rules"]} \
        == {"KeyrankGatewayMetricsAbsent", "KeyrankGatewayTritonErrors", "KeyrankReadinessFlapping"}


def test_service_monitors_need_the_crd_and_skip_the_headless_service(gpu, helm):  # noqa: F811
    assert not find(render(helm, GPU_VALUES, apis=()), "ServiceMonitor")
    monitor = one(gpu, "ServiceMonitor", "-triton")
    headless, clusterip = one(gpu, "Service", "-triton-grpc"), one(gpu, "Service", "-triton")
    assert not selects(monitor["spec"]["selector"], headless["metadata"]["labels"])
    assert selects(monitor["spec"]["selector"], clusterip["metadata"]["labels"])


def test_the_dashboard_is_scoped_by_namespace_release_and_pod_with_per_replica_panels(gpu):
    dashboard = json.loads(one(gpu, "ConfigMap", "-dashboard")["data"]["keyrank.json"])
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {"namespace", "release", "pod"} <= set(variables)
    for name in ("namespace", "release", "pod"):
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"  # Compose (no such labels): All matches
    panels = [p for p in dashboard["panels"] if p.get("targets")]
    for panel in panels:
        for target in panel["targets"]:
            promql_well_formed(target["expr"].replace("$__rate_interval", "1m"))
            for selector in re.findall(r'\b(?:keyrank|nv)_[a-z0-9_]+(\{(?:[^{}"]|"[^"]*")*\})?', target["expr"]):
                assert 'namespace=~"$namespace"' in selector and 'pod=~"$pod"' in selector and "${release}" in selector, \
                    (panel["title"], target["expr"])
    per_pod = [p for p in panels if all("by (pod" in t["expr"] for t in p["targets"])]
    exprs = " ".join(t["expr"] for p in per_pod for t in p["targets"])
    assert "nv_inference_request_success" in exprs and "nv_inference_queue_duration_us" in exprs and "keyrank_requests_total" in exprs


# --- item 5: model delivery safe to upgrade and fast to scale ---------------------------------


def _export_mounts(workload: dict, name: str) -> list[dict]:
    return [m for m in container(workload, name)["volumeMounts"] if m["name"] == "models"]


def test_each_model_version_is_exported_into_its_own_folder_that_pods_wait_for(gpu, helm):  # noqa: F811
    (job,) = find(gpu, "Job")
    (export,) = pod_spec(job)["containers"]
    out = next(e["value"] for e in export["env"] if e["name"] == "KEYRANK_PREPARE_OUT")
    key = out.removeprefix("/models/exports/")
    assert re.fullmatch(r"model-[0-9a-f]{16}", key), out
    for workload, name in ((one(gpu, "Deployment", "-gateway"), "gateway"), (one(gpu, "Deployment", "-triton"), "triton")):
        assert _export_mounts(workload, name) == [{"name": "models", "mountPath": "/models", "subPath": f"exports/{key}", "readOnly": True}]
        wait = next(c for c in pod_spec(workload)["initContainers"] if c["name"] == "wait-for-models")["command"][2]
        assert f"[ -f /claim/exports/{key}/gateway/manifest.json ]" in wait
    # A new model (or TensorRT option, or keyrank version) is a new folder and a new Job; the same values, the same.
    other = render(helm, GPU_VALUES, sets=("models.model=org/other-reranker",))
    (other_job,) = find(other, "Job")
    assert other_job["metadata"]["name"] != job["metadata"]["name"]
    assert _export_mounts(one(other, "Deployment", "-triton"), "triton")[0]["subPath"] != f"exports/{key}"
    for sets in (("models.tensorrtFp16=false",), ("models.prepareImage.tag=0.2.0",)):
        assert find(render(helm, GPU_VALUES, sets=sets), "Job")[0]["metadata"]["name"] != job["metadata"]["name"], sets
    assert find(render(helm, GPU_VALUES), "Job")[0]["metadata"]["name"] == job["metadata"]["name"]


def test_on_upgrade_the_export_is_a_hook_that_runs_before_the_pods_change(helm):  # noqa: F811
    installed = render(helm, GPU_VALUES)
    assert "annotations" not in find(installed, "Job")[0]["metadata"]  # on install it runs beside the waiting pods
    upgraded = render(helm, GPU_VALUES, extra=("--is-upgrade",))
    validate(upgraded)
    (job,) = find(upgraded, "Job")
    hooks = job["metadata"]["annotations"]
    assert set(hooks["helm.sh/hook"].split(",")) == {"pre-upgrade", "pre-rollback"}
    assert "before-hook-creation" in hooks["helm.sh/hook-delete-policy"]


def test_the_export_job_keeps_earlier_exports_for_a_rollback_and_removes_older_ones(gpu, tmp_path):
    (job,) = find(gpu, "Job")
    prune = next(c for c in pod_spec(job)["initContainers"] if c["name"] == "prune-exports")["command"][2]
    current = next(e["value"] for e in pod_spec(job)["containers"][0]["env"] if e["name"] == "KEYRANK_PREPARE_OUT").rsplit("/", 1)[1]
    exports = tmp_path / "exports"
    for age, name in enumerate(["model-old3", "model-old2", "model-old1", current, ".prepare-x"]):
        (exports / name).mkdir(parents=True)
        os.utime(exports / name, (1_000_000 + age, 1_000_000 + age))
    os.utime(exports / current, (10, 10))  # the current export, however old, is never removed
    subprocess.run(["sh", "-c", prune.replace("/models/exports", str(exports))], check=True, timeout=30)
    assert sorted(p.name for p in exports.iterdir()) == sorted([current, "model-old1", "model-old2", ".prepare-x"])


def test_tensorrt_engines_are_kept_on_a_claim_per_triton_release_gpu_and_export(gpu, tmp_path):
    validate(gpu)
    claim = one(gpu, "PersistentVolumeClaim", "-engine-cache")
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    triton = one(gpu, "Deployment", "-triton")
    volume = next(v for v in pod_spec(triton)["volumes"] if v["name"] == "engine-cache")
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    main = container(triton, "triton")
    assert {"name": "engine-cache", "mountPath": "/engine-cache"} in main["volumeMounts"]
    # The start script, run here with a stand-in nvidia-smi and tritonserver: the engine folder of config.pbtxt's
    # path (/tmp/keyrank_trt_cache) is the claim's folder of this Triton image, TensorRT version, GPU and export.
    bin_dir, tmp, cache = tmp_path / "bin", tmp_path / "tmp", tmp_path / "engine-cache"
    bin_dir.mkdir()
    tmp.mkdir()
    (bin_dir / "nvidia-smi").write_text('#!/bin/sh\necho "NVIDIA L4, 8.9"\n')
    (bin_dir / "tritonserver").write_text('#!/bin/sh\necho "tritonserver $*"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    script = main["command"][2].replace("/tmp/", f"{tmp}/").replace("/engine-cache", str(cache))
    ran = subprocess.run(["sh", "-c", script, *main["command"][3:], "--model-repository=/models/triton"], capture_output=True, text=True,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin", "TRT_VERSION": "10.5.0.18"}, timeout=30)
    assert ran.returncode == 0, ran.stderr
    assert "tritonserver --model-repository=/models/triton" in ran.stdout
    link = (tmp / "keyrank_trt_cache").resolve()
    assert link.is_dir() and link.is_relative_to(cache.resolve())
    parts = link.relative_to(cache.resolve()).parts
    assert parts[0] == "24.10-py3" and parts[1] == "trt-10.5.0.18" and "L4" in parts[2] and "8.9" in parts[2] and len(parts) == 4
    # Without nvidia-smi naming the GPU, no shared cache (an engine of another GPU must never be loaded).
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 1\n")
    (tmp / "keyrank_trt_cache").unlink()
    ran = subprocess.run(["sh", "-c", script, *main["command"][3:]], capture_output=True, text=True,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, timeout=30)
    assert ran.returncode == 0 and (tmp / "keyrank_trt_cache").is_dir() and not (tmp / "keyrank_trt_cache").is_symlink()
