"""deploy/helm/appliance: the chart lints clean, renders (Helm's own Go SDK, bundled in the
helm-python-sdk wheel: the same engine as `helm template`) with its defaults and with every
optional part on, and what it renders is valid against the Kubernetes API's schemas
(kubernetes-validate, strict: no field Kubernetes does not know). Each container runs a declared
process, sets only settings the appliance reads and takes its secrets from the existing Secret."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache

import kubernetes_validate
import pytest
import yaml
from jsonschema import Draft7Validator

from tests.deploy.manifests import DEPLOY, ROOT, unknown_variables

CHART = DEPLOY / "helm" / "appliance"
# The oldest and the newest Kubernetes the chart is checked against (Chart.yaml: kubeVersion >=1.27).
KUBERNETES_VERSIONS = ("1.27.0", "1.37.0")
EVERYTHING_ON = {
    "web": {"replicas": 2, "ingress": {"enabled": True, "className": "nginx", "tlsSecretName": "appliance-tls"}},
    "beat": {"enabled": True},
    "ingest": {"replicas": 3, "concurrency": 2},
    "media": {"existingClaim": "appliance-uploads"},
    "gpuNodes": {"replicas": 4, "tensorParallelSize": 2, "engineTls": {"existingSecret": "engine-tls"}},
    "settings": {"APPLIANCE_LDAP_URL": "ldaps://dc1.example.internal", "APPLIANCE_LDAP_USER_SEARCH_BASE": "OU=Staff"},
}
SECRETS = {"DATABASE_URL", "REDIS_URL", "APPLIANCE_SECRET_KEY", "APPLIANCE_ENGINE_TOKEN"}


# Helm's Go runtime is loaded in a child interpreter, never in the test process (which forks).
_HELM = """
import json, sys
import helm_python as helm
operation, chart, values = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if operation == "lint":
    out = helm.lint(chart, values, strict=True, namespace="appliance")
else:
    with helm.Chart.load(chart) as loaded:
        out = loaded.render(values, name="docs", namespace="appliance", is_install=True)
print(json.dumps(out))
"""


@cache
def _helm(operation: str, values_json: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", _HELM, operation, str(CHART), values_json],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def helm_lint(values: dict) -> dict:
    return json.loads(_helm("lint", json.dumps(values, sort_keys=True)))


def render(values: dict | None = None) -> list[dict]:
    """`helm template`: the chart's objects, rendered with ``values`` (a fresh copy each time)."""
    manifests = json.loads(_helm("render", json.dumps(values or {}, sort_keys=True)))
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith(".txt"):
            continue
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def by_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == kind}


def containers(objects: list[dict]) -> dict[str, dict]:
    """Every container of every workload, as ``<workload>/<container>``."""
    found = {}
    for obj in objects:
        if obj["kind"] in ("Deployment", "StatefulSet"):
            for container in obj["spec"]["template"]["spec"]["containers"]:
                found[f"{obj['metadata']['name']}/{container['name']}"] = container
    return found


@pytest.mark.parametrize("values", [{}, EVERYTHING_ON], ids=["defaults", "everything-on"])
def test_the_chart_lints_clean(values):
    result = helm_lint(values)
    assert result["errors"] == []
    # 1 is Helm's INFO (an icon is recommended); warnings and errors fail.
    assert [m for m in result["messages"] if m["severity"] >= 2] == []


def test_the_lint_finds_a_value_the_schema_refuses():
    result = helm_lint({"gpuNodes": {"tensorParallelSize": 0}})
    assert any("tensorParallelSize" in error for error in result["errors"])


@pytest.mark.parametrize("values", [{}, EVERYTHING_ON], ids=["defaults", "everything-on"])
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_what_the_chart_renders_is_valid_kubernetes(values, version):
    objects = render(values)
    assert objects
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)  # raises on anything it does not know


def test_the_validation_finds_a_broken_object():
    deployment = by_kind(render(), "Deployment")["docs-appliance-web"]
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["tcpSockett"] = {"port": 8000}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


def test_web_and_ingest_deployments_and_gpu_nodes():
    objects = render()
    # Beat is on by default: it schedules the sources' polls.
    assert set(by_kind(objects, "Deployment")) == {"docs-appliance-web", "docs-appliance-ingest", "docs-appliance-beat"}
    assert set(by_kind(objects, "StatefulSet")) == {"docs-appliance-gpu"}
    assert set(by_kind(objects, "Service")) == {"docs-appliance-web", "docs-appliance-gpu"}
    assert set(by_kind(objects, "PersistentVolumeClaim")) == {"docs-appliance-media"}
    assert by_kind(objects, "Ingress") == {}  # optional, off by default
    assert by_kind(objects, "Secret") == {}  # secrets come from an existing Secret, never the chart
    on = render(EVERYTHING_ON)
    assert set(by_kind(on, "Deployment")) == {"docs-appliance-web", "docs-appliance-ingest", "docs-appliance-beat"}
    ingress = by_kind(on, "Ingress")["docs-appliance"]
    assert ingress["spec"]["tls"][0]["secretName"] == "appliance-tls"
    assert by_kind(on, "PersistentVolumeClaim") == {}  # an existing claim for the uploads


def test_each_container_runs_a_declared_process():
    from appliance.management.commands.process import _NAME

    args = {name: container["args"] for name, container in containers(render(EVERYTHING_ON)).items()}
    assert args == {
        "docs-appliance-web/web": ["process", "web"],
        "docs-appliance-web/node": ["announce_node"],
        "docs-appliance-beat/beat": ["process", "beat"],
        "docs-appliance-ingest/ingest": ["process", "ingest"],
        "docs-appliance-gpu/engine": ["process", "engine-0"],
        "docs-appliance-gpu/prefill": ["process", "prefill-0"],
        "docs-appliance-gpu/decode": ["process", "decode-0"],
        "docs-appliance-gpu/node": ["announce_node"],
    }
    for command in args.values():
        assert command[0] == "announce_node" or _NAME.match(command[1])


def test_a_gpu_node_takes_its_tensor_parallel_gpus_and_shares_the_engines_socket():
    objects = render(EVERYTHING_ON)
    gpu = by_kind(objects, "StatefulSet")["docs-appliance-gpu"]
    assert gpu["spec"]["replicas"] == 4
    pod = gpu["spec"]["template"]["spec"]
    engine, prefill, decode, node = pod["containers"]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert {"name": "APPLIANCE_TENSOR_PARALLEL_SIZE", "value": "2"} in engine["env"]
    assert not any("nvidia.com/gpu" in c.get("resources", {}).get("limits", {}) for c in (prefill, decode, node))
    for container in (engine, prefill, decode, node):  # var/run/engine.sock in one volume
        assert {"name": "var", "mountPath": "/var/lib/appliance"} in container["volumeMounts"]
    assert {"name": "APPLIANCE_ROLES", "value": "engine,prefill,decode"} in node["env"]
    # With engine TLS, the engine listens and the web node asks the first GPU node about it.
    assert {"name": "APPLIANCE_ENGINE_LISTEN", "value": "0.0.0.0:8470"} in engine["env"]
    web = containers(objects)["docs-appliance-web/web"]
    assert {"name": "APPLIANCE_ENGINE_URL", "value": "tls://docs-appliance-gpu-0.docs-appliance-gpu:8470"} in web["env"]


def test_the_containers_set_only_settings_the_appliance_reads_and_secrets_from_the_secret():
    objects = render(EVERYTHING_ON)
    settings = by_kind(objects, "ConfigMap")["docs-appliance-settings"]["data"]
    assert unknown_variables(settings) == []
    for name, container in containers(objects).items():
        env = {item["name"]: item for item in container["env"]}
        assert unknown_variables(env) == [], name
        assert not SECRETS & set(env), name
        for secret in SECRETS:
            assert env[f"{secret}_FILE"]["value"].startswith("/run/secrets/appliance/"), (name, secret)
        assert {"name": "secrets", "mountPath": "/run/secrets/appliance", "readOnly": True} in container["volumeMounts"]
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
    for workload in [*by_kind(objects, "Deployment").values(), *by_kind(objects, "StatefulSet").values()]:
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        assert volumes["secrets"]["secret"]["secretName"] == "appliance-secrets"
        assert workload["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_the_web_server_and_the_ingest_workers_share_the_uploads():
    objects = render()
    for name in ("docs-appliance-web", "docs-appliance-ingest"):
        volumes = {v["name"]: v for v in by_kind(objects, "Deployment")[name]["spec"]["template"]["spec"]["volumes"]}
        assert volumes["media"]["persistentVolumeClaim"]["claimName"] == "docs-appliance-media"
    claim = by_kind(objects, "PersistentVolumeClaim")["docs-appliance-media"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


# --- values.schema.json, on its own ---------------------------------------------------------


def values_schema() -> Draft7Validator:
    schema = json.loads((CHART / "values.schema.json").read_text())
    Draft7Validator.check_schema(schema)
    return Draft7Validator(schema)


def test_the_default_values_meet_the_values_schema():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert list(values_schema().iter_errors(values)) == []
    assert unknown_variables(values["settings"]) == []


@pytest.mark.parametrize(
    "change",
    [
        {"settings": {"APPLIANCE_SECRET_KEY": "in the values, for anyone to read"}},
        {"settings": {"DATABASE_URL": "postgresql://appliance:password@db/appliance"}},
        {"settings": {"APPLIANCE_ENGINES": "2"}},  # one engine per pod: scale with gpuNodes.replicas
        {"gpuNodes": {"tensorParallelSize": 0}},
        {"web": {"replica": 2}},
        {"media": {"size": "lots"}},
    ],
)
def test_the_values_schema_refuses(change):
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for key, part in change.items():
        values[key] = {**values[key], **part}
    assert list(values_schema().iter_errors(values)), change
