"""The deployment artifacts hold up to the ecosystem's own tools.

No cluster runs here, so these tests check what can be checked without one:
`helm lint`/`helm template` with the default and the GPU values, the rendered
manifests against the Kubernetes OpenAPI schemas (kubernetes-validate,
strict), the properties that matter in production (GPU, non-root,
NetworkPolicy, probes, PDBs, HPAs), `docker-compose config` of the GPU file
and of the CPU override, yamllint, and the Dockerfiles' essentials (the
images themselves are built and run by tests/test_docker.py). helm comes from
scripts/install-tools.sh (called here when .tools/bin/helm is missing);
docker-compose and yamllint are Debian packages (skipped with the reason when
absent).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "k8s" / "keyrank"
GPU_VALUES = CHART / "values-gpu.yaml"
INSTALL_TOOLS = ROOT / "scripts" / "install-tools.sh"
TOOLS_BIN = Path(os.environ.get("KEYRANK_TOOLS_DIR", ROOT / ".tools")) / "bin"
# Oldest Kubernetes the chart targets (Chart.yaml kubeVersion >= 1.25; 1.30 = kubectl of the tools).
KUBE_VERSION = "1.30.0"
YAMLLINT_CONFIG = "{extends: relaxed, rules: {line-length: {max: 160}}}"


# --- tools and rendering ------------------------------------------------------------------


@pytest.fixture(scope="module")
def helm() -> str:
    """Path of the helm binary, installed into .tools/ on first use."""
    binary = TOOLS_BIN / "helm"
    if not binary.exists():
        result = subprocess.run([str(INSTALL_TOOLS)], capture_output=True, text=True, timeout=300)
        if result.returncode != 0 or not binary.exists():
            pytest.fail(f"could not install helm with {INSTALL_TOOLS}:\n{result.stdout}\n{result.stderr}")
    return str(binary)


MONITORING_APIS = ("monitoring.coreos.com/v1", "monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PrometheusRule")
"""What a cluster with prometheus-operator serves (Helm's Capabilities list group/version and group/version/Kind)."""


def render(helm: str, *values: Path, sets: tuple[str, ...] = (), apis: tuple[str, ...] = MONITORING_APIS,
           extra: tuple[str, ...] = ()) -> list[dict]:
    """`helm template` of the chart (with prometheus-operator's CRDs unless `apis` says otherwise): the rendered objects."""
    command = [helm, "template", "keyrank", str(CHART), "--namespace", "search", "--kube-version", KUBE_VERSION]
    for api in apis:
        command += ["--api-versions", api]
    for path in values:
        command += ["-f", str(path)]
    for item in sets:
        command += ["--set", item]
    result = subprocess.run(command + list(extra), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def default_objects(helm: str) -> list[dict]:
    return render(helm)


@pytest.fixture(scope="module")
def gpu_objects(helm: str) -> list[dict]:
    return render(helm, GPU_VALUES)


SERVED = {"served": [{"name": "base", "model": "cross-encoder/ms-marco-MiniLM-L-6-v2"}, {"name": "ft", "model": "/checkpoints/ft"}],
          "default": "ft"}
"""Two models side by side: values of models.served and models.default."""


@pytest.fixture(scope="module")
def served_values(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("values") / "served.yaml"
    path.write_text(yaml.safe_dump({"models": SERVED}))
    return path


@pytest.fixture(scope="module")
def served_objects(helm: str, served_values: Path) -> list[dict]:
    return render(helm, served_values)


@pytest.fixture(scope="module")
def served_gpu_objects(helm: str, served_values: Path) -> list[dict]:
    return render(helm, GPU_VALUES, served_values)


@pytest.fixture(scope="module", params=["default", "gpu", "served", "served-gpu"])
def objects(request, default_objects, gpu_objects, served_objects, served_gpu_objects) -> list[dict]:
    """Every rendering, so a property holds whichever values file is used (one model or several)."""
    return {"default": default_objects, "gpu": gpu_objects, "served": served_objects, "served-gpu": served_gpu_objects}[request.param]


def find(objects: list[dict], kind: str, name_suffix: str = "") -> list[dict]:
    return [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]


def one(objects: list[dict], kind: str, name_suffix: str) -> dict:
    found = find(objects, kind, name_suffix)
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def pod_labels(workload: dict) -> dict:
    return workload["spec"]["template"]["metadata"]["labels"]


def selects(selector: dict, labels: dict) -> bool:
    """Whether a label selector (matchLabels, matchExpressions) picks objects with these labels."""
    expressions = {
        "In": lambda e: labels.get(e["key"]) in e["values"],
        "NotIn": lambda e: labels.get(e["key"]) not in e["values"],
        "Exists": lambda e: e["key"] in labels,
        "DoesNotExist": lambda e: e["key"] not in labels,
    }
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()) and \
        all(expressions[e["operator"]](e) for e in selector.get("matchExpressions", []))


def container(workload: dict, name: str) -> dict:
    return next(c for c in pod_spec(workload)["containers"] if c["name"] == name)


# --- helm -----------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [[], [GPU_VALUES], ["served"]], ids=["default", "gpu", "served"])
def test_chart_lints_strictly_with_default_and_gpu_values(helm, values, served_values):
    command = [helm, "lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION]
    for path in values:
        path = served_values if path == "served" else path
        command += ["-f", str(path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_rendered_manifests_validate_against_the_kubernetes_schemas(objects):
    import kubernetes_validate

    errors, validated = [], 0
    for obj in objects:
        if obj["apiVersion"].startswith(("monitoring.coreos.com/", "keda.sh/")):
            continue  # a CRD: not in the core schemas; tests/test_chart_scale.py checks them against theirs
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
            validated += 1
        except kubernetes_validate.ValidationError as error:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {error.message} at {list(error.path)}")
    assert not errors, "\n".join(errors)
    assert validated >= 9  # SA, 2 Services, 2 Deployments, HPA, 2 PDBs, 2 NetworkPolicies at least


def test_every_object_carries_the_release_labels(objects):
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "keyrank", obj["metadata"]["name"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


def test_an_unknown_model_provisioning_mode_fails_rendering(helm):
    result = subprocess.run(
        [helm, "template", "keyrank", str(CHART), "--set", "models.provisioning=s3"], capture_output=True, text=True
    )
    assert result.returncode != 0
    # values.schema.json refuses it before the template's own check would
    assert "models.provisioning" in result.stderr and '"init", "pvc"' in result.stderr, result.stderr


# --- Triton on the GPU pool -------------------------------------------------------------------


def test_triton_requests_a_gpu_and_tolerates_the_gpu_taint(objects):
    triton = one(objects, "Deployment", "-triton")
    resources = container(triton, "triton")["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 1
    assert resources["requests"]["nvidia.com/gpu"] == 1
    assert "memory" in resources["limits"] and "cpu" in resources["requests"]
    tolerations = pod_spec(triton)["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations


def test_gpu_values_pin_triton_to_the_gpu_node_pool_and_keep_the_gateway_off_it(gpu_objects):
    triton = one(gpu_objects, "Deployment", "-triton")
    assert pod_spec(triton)["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    anti = pod_spec(triton)["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert selects(anti["labelSelector"], pod_labels(triton)) and anti["topologyKey"] == "kubernetes.io/hostname"

    gateway = one(gpu_objects, "Deployment", "-gateway")
    assert "tolerations" not in pod_spec(gateway)
    term = pod_spec(gateway)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"][0]["operator"] == "DoesNotExist"
    assert "nvidia.com/gpu" not in json.dumps(container(gateway, "gateway")["resources"])


def test_triton_serves_the_prepared_repository_with_shared_memory(objects):
    triton = one(objects, "Deployment", "-triton")
    main = container(triton, "triton")
    several = any(c["name"] == "model-repository" for c in pod_spec(triton)["initContainers"])  # models.served
    assert ("--model-repository=/repository" if several else "--model-repository=/models/triton") in main["args"]
    assert "--strict-readiness=true" in main["args"]
    volumes = {v["name"]: v for v in pod_spec(triton)["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert mounts["/dev/shm"]["name"] == "dshm"
    models = [m for m in main["volumeMounts"] if m["name"] == "models"]
    assert models and all(m["readOnly"] is True for m in models)
    assert {m["mountPath"] for m in models} in ({"/models"}, {"/models/base", "/models/ft"})


def test_the_gateway_talks_grpc_to_the_triton_service(objects):
    gateway = one(objects, "Deployment", "-gateway")
    service = one(objects, "Service", "-triton")
    headless = one(objects, "Service", "-triton-grpc")
    env = {e["name"]: e.get("value") for e in container(gateway, "gateway")["env"]}
    grpc = next(p for p in headless["spec"]["ports"] if p["name"] == "grpc")
    assert env["KEYRANK_TRITON_URL"] == f"dns:///{headless['metadata']['name']}.search.svc.cluster.local:{grpc['port']}" \
        == "dns:///keyrank-triton-grpc.search.svc.cluster.local:8001"
    assert container(gateway, "gateway")["args"] == ["serve"]  # the env var is the one source of the address
    assert env["KEYRANK_HOST"] == "0.0.0.0" and env["KEYRANK_MODEL_DIR"] == "/models"
    assert service["spec"]["type"] == "ClusterIP"
    assert selects({"matchLabels": service["spec"]["selector"]}, pod_labels(one(objects, "Deployment", "-triton")))


# --- security --------------------------------------------------------------------------------


def test_every_container_runs_non_root_read_only_without_capabilities(objects):
    workloads = find(objects, "Deployment") + find(objects, "Job")
    assert len(workloads) >= 2
    for workload in workloads:
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] > 0
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert spec["automountServiceAccountToken"] is False
        for c in spec["containers"] + spec.get("initContainers", []):
            context = c["securityContext"]
            where = f"{workload['metadata']['name']}/{c['name']}"
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["capabilities"]["drop"] == ["ALL"], where
            assert "limits" in c["resources"] and "requests" in c["resources"], where


def test_only_the_gateway_reaches_triton_inference_ports(objects):
    triton, gateway = one(objects, "Deployment", "-triton"), one(objects, "Deployment", "-gateway")
    policy = next(p for p in find(objects, "NetworkPolicy") if selects(p["spec"]["podSelector"], pod_labels(triton)))
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert not selects(policy["spec"]["podSelector"], pod_labels(gateway))
    inference_ports = {8000, 8001}
    opened = set()
    for rule in policy["spec"]["ingress"]:
        ports = {p["port"] for p in rule["ports"]}
        assert rule.get("from"), "an ingress rule without `from` admits every pod"
        if ports & inference_ports:
            # only pods with the gateway's labels, in this namespace
            assert rule["from"] == [{"podSelector": {"matchLabels": rule["from"][0]["podSelector"]["matchLabels"]}}]
            assert selects(rule["from"][0]["podSelector"], pod_labels(gateway))
            assert not selects(rule["from"][0]["podSelector"], pod_labels(triton))
            opened |= ports
        else:
            assert ports == {8002}, "scrapers get the metrics port only"
    assert opened == inference_ports


def test_api_key_comes_from_a_secret_never_a_plain_env_value(helm, gpu_objects):
    env = {e["name"]: e for e in container(one(gpu_objects, "Deployment", "-gateway"), "gateway")["env"]}
    assert env["KEYRANK_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "keyrank-api-key", "key": "api-key"}

    rendered = render(helm, sets=("gateway.apiKey.enabled=true", "gateway.apiKey.value=s3cret"))
    secret = one(rendered, "Secret", "-api-key")
    gateway_env = {e["name"]: e for e in container(one(rendered, "Deployment", "-gateway"), "gateway")["env"]}
    assert gateway_env["KEYRANK_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    assert "s3cret" not in json.dumps(gateway_env)

    missing = subprocess.run([helm, "template", "keyrank", str(CHART), "--set", "gateway.apiKey.enabled=true"],
                             capture_output=True, text=True)
    assert missing.returncode != 0 and "gateway.apiKey" in missing.stderr


# --- health, disruption, scaling -------------------------------------------------------------


def test_probes_watch_health_and_readiness_endpoints(objects):
    gateway = container(one(objects, "Deployment", "-gateway"), "gateway")
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert gateway["startupProbe"]["httpGet"]["path"] == "/healthz"
    triton = container(one(objects, "Deployment", "-triton"), "triton")
    assert triton["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert triton["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    # model loading (and a TensorRT build) gets minutes before liveness can kill the pod
    startup = triton["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    assert {"name": "http", "containerPort": 8000, "protocol": "TCP"} in triton["ports"]


def test_disruption_budgets_cover_gateway_and_triton(objects):
    budgets = find(objects, "PodDisruptionBudget")
    for component in ("-gateway", "-triton"):
        workload = one(objects, "Deployment", component)
        covering = [b for b in budgets if selects(b["spec"]["selector"], pod_labels(workload))]
        assert len(covering) == 1, component
        spec = covering[0]["spec"]
        assert ("minAvailable" in spec) != ("maxUnavailable" in spec)


def test_gateway_scales_on_cpu_and_triton_on_queue_time_with_gpu_values(default_objects, gpu_objects):
    gateway_hpa = one(default_objects, "HorizontalPodAutoscaler", "-gateway")
    assert gateway_hpa["spec"]["scaleTargetRef"]["name"] == one(default_objects, "Deployment", "-gateway")["metadata"]["name"]
    assert gateway_hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert "replicas" not in one(default_objects, "Deployment", "-gateway")["spec"]  # the HPA owns it
    assert not find(default_objects, "HorizontalPodAutoscaler", "-triton")  # needs prometheus-adapter: opt-in

    triton_hpa = one(gpu_objects, "HorizontalPodAutoscaler", "-triton")
    assert triton_hpa["spec"]["scaleTargetRef"]["name"] == one(gpu_objects, "Deployment", "-triton")["metadata"]["name"]
    metric = triton_hpa["spec"]["metrics"][0]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == "triton_queue_avg_us"
    assert triton_hpa["spec"]["minReplicas"] >= 1 < triton_hpa["spec"]["maxReplicas"]


# --- models, monitoring ----------------------------------------------------------------------


def test_default_values_export_the_model_in_an_init_container(default_objects):
    for component in ("-gateway", "-triton"):
        workload = one(default_objects, "Deployment", component)
        init = pod_spec(workload)["initContainers"]
        assert [c["name"] for c in init] == ["prepare-models"]
        env = {e["name"]: e["value"] for e in init[0]["env"]}
        assert env["KEYRANK_PREPARE_MODEL"] == "cross-encoder/ms-marco-MiniLM-L-6-v2"
        volume = next(v for v in pod_spec(workload)["volumes"] if v["name"] == "models")
        assert "emptyDir" in volume
    assert not find(default_objects, "Job") and not find(default_objects, "PersistentVolumeClaim")


def test_gpu_values_export_once_into_a_shared_claim(gpu_objects):
    claim = one(gpu_objects, "PersistentVolumeClaim", "-models")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    (job,) = find(gpu_objects, "Job")
    assert re.fullmatch(r"keyrank-export-[0-9a-f]{10}", job["metadata"]["name"])
    job_env = {e["name"]: e["value"] for e in pod_spec(job)["containers"][0]["env"]}
    assert job_env["KEYRANK_PREPARE_TENSORRT_FP16"] == "1"
    for workload in [job] + find(gpu_objects, "Deployment"):
        volume = next(v for v in pod_spec(workload)["volumes"] if v["name"] == "models")
        assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    for workload in find(gpu_objects, "Deployment"):
        assert [c["name"] for c in pod_spec(workload)["initContainers"]] == ["wait-for-models"]


def _env(workload: dict, name: str) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container(workload, name).get("env", [])}


def test_served_models_are_each_exported_and_named_to_the_gateway(served_objects):
    gateway = one(served_objects, "Deployment", "-gateway")
    assert _env(gateway, "gateway")["KEYRANK_MODELS"] == "base=/models/base,ft=/models/ft"
    assert _env(gateway, "gateway")["KEYRANK_DEFAULT_MODEL"] == "ft"
    for workload in find(served_objects, "Deployment"):
        init = pod_spec(workload)["initContainers"]
        exports = {e["KEYRANK_PREPARE_MODEL"]: e["KEYRANK_PREPARE_OUT"]
                   for e in ({x["name"]: x["value"] for x in c["env"]} for c in init if c["name"].startswith("prepare-model-"))}
        assert exports == {"cross-encoder/ms-marco-MiniLM-L-6-v2": "/models/base", "/checkpoints/ft": "/models/ft"}


def test_triton_loads_every_served_model_under_its_name(served_objects, tmp_path):
    triton = one(served_objects, "Deployment", "-triton")
    args = container(triton, "triton")["args"]
    assert "--model-repository=/repository" in args
    assert "--model=ft" in container(triton, "model-guard")["args"]  # the guard watches the default model
    script = next(c for c in pod_spec(triton)["initContainers"] if c["name"] == "model-repository")["command"][2]
    # The script, run on prepared-looking folders: each model under its name, its config renamed.
    for name in ("base", "ft"):
        version = tmp_path / "models" / name / "triton" / "cross_encoder" / "1"
        version.mkdir(parents=True)
        (version / "model.onnx").write_text(name)
        (version.parent / "config.pbtxt").write_text('name: "cross_encoder"\nbackend: "onnxruntime"\n')
    local = script.replace("/models/", f"{tmp_path}/models/").replace("/repository", f"{tmp_path}/repository")
    subprocess.run(["sh", "-c", local], check=True, timeout=30)
    for name in ("base", "ft"):
        config = (tmp_path / "repository" / name / "config.pbtxt").read_text()
        assert config == f'name: "{name}"\nbackend: "onnxruntime"\n'
        assert (tmp_path / "repository" / name / "1" / "model.onnx").read_text() == name


def test_served_models_in_a_shared_claim_are_exported_by_one_job_and_awaited(served_gpu_objects):
    (job,) = find(served_gpu_objects, "Job")
    outs = sorted(next(e["value"] for e in c["env"] if e["name"] == "KEYRANK_PREPARE_OUT") for c in pod_spec(job)["containers"])
    assert [re.sub(r"-[0-9a-f]{16}$", "", out) for out in outs] == ["/models/exports/base", "/models/exports/ft"]
    for workload in find(served_gpu_objects, "Deployment"):
        wait = next(c for c in pod_spec(workload)["initContainers"] if c["name"] == "wait-for-models")
        for out in outs:
            export = out.replace("/models/", "/claim/")
            assert f"{export}/gateway/manifest.json" in wait["command"][2] and f"{export}/triton" in wait["command"][2]


@pytest.mark.parametrize(
    ("served", "said"),
    [
        ({"served": [{"name": "bad name", "model": "m"}]}, 'models.served[0].name "bad name": letters, digits'),
        ({"served": [{"name": "a", "model": "m"}, {"name": "a", "model": "m2"}]}, 'models.served[1].name "a" is given twice'),
        ({"served": [{"name": "a"}]}, "models.served[0] must be {name, model}"),
        ({"served": [{"name": "a", "model": "m"}], "default": "b"}, 'models.default "b" is not one of models.served'),
    ],
)
def test_a_bad_served_model_list_fails_rendering_naming_the_value(helm, tmp_path, served, said):
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"models": served}))
    result = subprocess.run([helm, "template", "keyrank", str(CHART), "-f", str(values)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert said in result.stderr, result.stderr


def test_service_monitors_scrape_named_ports_of_both_services(gpu_objects):
    monitors = find(gpu_objects, "ServiceMonitor")
    assert len(monitors) == 2
    services = find(gpu_objects, "Service")
    for monitor in monitors:
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        service = next(s for s in services if selects(monitor["spec"]["selector"], s["metadata"]["labels"]))
        port_names = {p["name"] for p in service["spec"]["ports"]}
        assert monitor["spec"]["endpoints"][0]["port"] in port_names
        assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"


def test_grafana_dashboard_shows_per_stage_latency(gpu_objects):
    configmap = one(gpu_objects, "ConfigMap", "-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(configmap["data"]["keyrank.json"])
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert any("keyrank_stage_seconds_bucket" in q and "stage" in q for q in queries)
    assert any("nv_inference_queue_duration_us" in q for q in queries)
    assert any("keyrank_requests_total" in q and "model" in q for q in queries)  # requests by served model


# --- docker-compose, yamllint ----------------------------------------------------------------


def compose_config(*files: str) -> dict:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("docker-compose binary absent (Debian package docker-compose)")
    command = [binary]
    for name in files:
        command += ["-f", str(ROOT / name)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYRANK_")}
    result = subprocess.run(command + ["config"], capture_output=True, text=True, cwd=ROOT, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["services"]


def package_version() -> str:
    return re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE).group(1)


def test_docker_compose_accepts_the_compose_file():
    services = compose_config("docker-compose.yml")
    assert set(services) >= {"models", "triton", "gateway", "prometheus"}
    triton, gateway = services["triton"], services["gateway"]
    assert "ports" not in triton, "Triton must not be published to the host"
    # The GPU through the NVIDIA runtime: a scalar the CPU override can replace.
    assert triton["runtime"] == "nvidia" and triton["environment"]["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert triton["shm_size"]
    assert "/v2/health/ready" in " ".join(triton["healthcheck"]["test"])
    assert gateway["depends_on"]["triton"]["condition"] == "service_healthy"
    assert triton["depends_on"]["models"]["condition"] == "service_completed_successfully"
    # Triton's address in one place, the env var (a --triton-url flag would win over it)
    assert gateway["command"] == ["serve"] and gateway["environment"]["KEYRANK_TRITON_URL"] == "triton:8001"
    assert gateway["read_only"] is True and gateway["cap_drop"] == ["ALL"]
    # Published on loopback unless the user says otherwise.
    for service in ("gateway", "prometheus"):
        for port in services[service]["ports"]:
            assert str(port).startswith("127.0.0.1:"), (service, port)
    # Image tags default to the package version.
    for service in ("models", "triton", "gateway"):
        assert services[service]["image"].endswith(f":{package_version()}"), services[service]["image"]


def test_cpu_override_swaps_triton_for_the_cpu_image_and_leaves_the_gateway_as_is():
    gpu = compose_config("docker-compose.yml")
    cpu = compose_config("docker-compose.yml", "docker-compose.cpu.yml")
    triton = cpu["triton"]
    assert triton["image"] == f"keyrank-triton-cpu:{package_version()}"
    assert triton["build"]["context"].endswith("docker/triton-cpu")
    assert triton["runtime"] == "runc" and triton["environment"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "deploy" not in triton and "ports" not in triton
    assert triton["read_only"] is True and triton["cap_drop"] == ["ALL"] and triton["restart"] == "unless-stopped"
    assert triton["init"] is True
    assert "/v2/health/ready" in " ".join(triton["healthcheck"]["test"])
    # The gateway talks to `triton` by service name exactly as with the GPU file.
    assert cpu["gateway"] == gpu["gateway"]
    models = cpu["models"]
    assert models["environment"]["KEYRANK_PREPARE_MODEL"] == "/checkpoint"
    assert any(str(v).endswith(":/checkpoint:ro") or (isinstance(v, dict) and v.get("target") == "/checkpoint")
               for v in models["volumes"])


def test_prometheus_scrapes_the_gateway_and_triton_metrics_port():
    config = yaml.safe_load((ROOT / "docker" / "prometheus.yml").read_text())
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {"gateway:8080", "triton:8002"}


def test_yaml_files_pass_yamllint():
    binary = shutil.which("yamllint")
    if binary is None:
        pytest.skip("yamllint binary absent (Debian package yamllint)")
    files = [ROOT / "docker-compose.yml", ROOT / "docker-compose.cpu.yml", ROOT / "docker" / "prometheus.yml",
             ROOT / "docker" / "grafana",
             CHART / "Chart.yaml", CHART / "values.yaml", GPU_VALUES]
    result = subprocess.run([binary, "--strict", "-d", YAMLLINT_CONFIG, *map(str, files)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# --- Dockerfiles -----------------------------------------------------------------------------


def dockerfile_stages(path: Path) -> list[list[tuple[str, str]]]:
    """Instructions of each build stage as (INSTRUCTION, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, arguments = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instruction.upper(), arguments.strip()))
    return stages


def instructions(stage: list[tuple[str, str]], name: str) -> list[str]:
    return [arguments for instruction, arguments in stage if instruction == name]


def stage(stages: list[list[tuple[str, str]]], name: str) -> list[tuple[str, str]]:
    """The stage ``FROM ... AS name``."""
    return next(s for s in stages if instructions(s, "FROM")[0].endswith(f" AS {name}"))


def test_gateway_image_is_multi_stage_non_root_with_healthcheck_and_no_dev_deps():
    stages = dockerfile_stages(ROOT / "Dockerfile")
    assert len(stages) >= 2
    build, final = stage(stages, "build"), stages[-1]
    users = instructions(final, "USER")
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    healthcheck = " ".join(instructions(final, "HEALTHCHECK"))
    assert "/healthz" in healthcheck
    assert "8080" in instructions(final, "EXPOSE")
    final_text = " ".join(a for _, a in final)
    for tool in ("build-essential", "gcc", "pytest", "torch", "git "):
        assert tool not in final_text, f"{tool} in the runtime stage"
    # the package is installed without extras: no export (torch), test or eval dependencies
    installs = " ".join(a for a in instructions(build, "RUN") if "pip install" in a)
    assert "pip install --no-deps ." in installs and "pip install -r /tmp/requirements.txt" in installs
    assert ".[" not in installs
    requirements = " ".join(instructions(stage(stages, "requirements"), "RUN"))
    assert "['project']['dependencies']" in requirements and "optional-dependencies" not in requirements
    copies = instructions(final, "COPY")
    assert copies and all(c.startswith("--from=build") for c in copies), "runtime copies only the built venv"
    env = " ".join(instructions(final, "ENV"))
    assert "KEYRANK_HOST=0.0.0.0" in env and "KEYRANK_WORKERS=" in env
    assert instructions(final, "ENTRYPOINT") == ['["keyrank"]']


def test_triton_image_is_the_official_container_running_unprivileged():
    path = ROOT / "docker" / "triton" / "Dockerfile"
    (stage,) = dockerfile_stages(path)
    base = re.search(r"^ARG TRITON_IMAGE=(\S+)$", path.read_text(), re.MULTILINE)
    assert base and re.fullmatch(r"nvcr\.io/nvidia/tritonserver:\d{2}\.\d{2}-py3", base.group(1))
    assert instructions(stage, "FROM") == ["${TRITON_IMAGE}"]
    assert instructions(stage, "USER")[-1].split(":")[0] not in {"root", "0"}
    assert "/v2/health/ready" in " ".join(instructions(stage, "HEALTHCHECK"))
    entrypoint = " ".join(instructions(stage, "ENTRYPOINT"))
    assert "--model-repository=/models/triton" in entrypoint and "--strict-readiness=true" in entrypoint


def test_cpu_triton_image_serves_the_embedded_repository_like_the_gpu_image():
    path = ROOT / "docker" / "triton-cpu" / "Dockerfile"
    build, final = dockerfile_stages(path)
    assert re.search(r"^ARG PYTHON_IMAGE=\S+$", path.read_text(), re.MULTILINE)
    assert instructions(final, "FROM") == ["${PYTHON_IMAGE} AS runtime"]
    assert "nvidia-pytriton==" in " ".join(instructions(build, "RUN"))
    assert instructions(final, "USER")[-1].split(":")[0] not in {"root", "0"}
    entrypoint = " ".join(instructions(final, "ENTRYPOINT"))
    assert "--model-repository=/models/triton-embedded" in entrypoint and "--strict-readiness=true" in entrypoint
    assert "--backend-directory=/opt/triton/backends" in entrypoint
    # The same ports and health endpoint as the NGC image, so compose and the chart take either.
    (gpu,) = dockerfile_stages(ROOT / "docker" / "triton" / "Dockerfile")
    assert instructions(final, "EXPOSE") == instructions(gpu, "EXPOSE") == ["8000 8001 8002"]
    for port in ("8000", "8001", "8002"):
        assert f"--{dict(zip(('8000', '8001', '8002'), ('http', 'grpc', 'metrics')))[port]}-port={port}" in entrypoint
    assert "/v2/health/ready" in " ".join(instructions(final, "HEALTHCHECK"))


DOCKERFILES = [ROOT / "Dockerfile", ROOT / "docker" / "prepare" / "Dockerfile", ROOT / "docker" / "triton" / "Dockerfile",
               ROOT / "docker" / "triton-cpu" / "Dockerfile"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_dockerfiles_build_with_the_classic_builder_and_no_frontend_image(path):
    """No `# syntax=` line (BuildKit would pull a frontend image from a registry) and nothing only
    BuildKit understands (RUN --mount, COPY --chmod/--link, heredocs): Debian's docker.io has no buildx."""
    text = path.read_text()
    assert not re.search(r"^#\s*syntax\s*=", text, re.MULTILINE | re.IGNORECASE)
    assert not re.search(r"--mount=|--chmod=|--link\b|<<\s*['\"]?[A-Z]+", text)
    # Every image's base is a build argument, so an air-gapped user points it at a local image.
    assert re.search(r"^ARG (PYTHON_IMAGE|TRITON_IMAGE)=", text, re.MULTILINE)


def test_images_carry_oci_labels_with_the_version_build_argument():
    for path in (ROOT / "Dockerfile", ROOT / "docker" / "prepare" / "Dockerfile", ROOT / "docker" / "triton-cpu" / "Dockerfile"):
        final = dockerfile_stages(path)[-1]
        labels = " ".join(instructions(final, "LABEL"))
        assert 'org.opencontainers.image.version="${VERSION}"' in labels, path
        assert "org.opencontainers.image.title=" in labels and "org.opencontainers.image.source=" in labels, path
        assert f"VERSION={package_version()}" in instructions(final, "ARG"), path


def test_prepare_image_installs_the_export_extra_and_runs_unprivileged():
    stages = dockerfile_stages(ROOT / "docker" / "prepare" / "Dockerfile")
    build = stage(stages, "build")
    installs = " ".join(a for a in instructions(build, "RUN") if "pip install" in a)
    assert ".[export" in installs
    requirements = " ".join(instructions(stage(stages, "requirements"), "RUN"))
    assert "['export']" in requirements and "['dense']" in requirements
    # PyTorch comes first, from where TORCH_PIP_ARGS says (default: the CPU index), never PyPI's CUDA build.
    assert installs.index('pip install $TORCH_PIP_ARGS "$TORCH_SPEC"') < installs.index(".[export")
    assert 'TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"' in instructions(build, "ARG")
    assert instructions(stages[-1], "USER")[-1].split(":")[0] not in {"root", "0"}


def test_prepare_entrypoint_skips_a_volume_that_holds_the_same_model(tmp_path):
    (tmp_path / "gateway").mkdir()
    (tmp_path / "gateway" / "manifest.json").write_text(json.dumps({"cross_encoder": {"source": "org/model"}}))
    # PATH without `keyrank`: a call to `keyrank prepare` would fail the script
    env = {"PATH": "/usr/bin:/bin", "KEYRANK_PREPARE_MODEL": "org/model", "KEYRANK_PREPARE_OUT": str(tmp_path)}
    script = str(ROOT / "docker" / "prepare" / "entrypoint.sh")
    skipped = subprocess.run(["sh", script], env=env, capture_output=True, text=True)
    assert skipped.returncode == 0, skipped.stderr
    assert "nothing to do" in skipped.stdout

    other = subprocess.run(["sh", script], env=env | {"KEYRANK_PREPARE_MODEL": "org/other"}, capture_output=True, text=True)
    assert other.returncode != 0 and "keyrank prepare --model org/other" in other.stdout
