"""deploy/kubernetes/: steward per GPU node under a Gateway API Inference Extension router.

No cluster runs here, so each manifest is checked as far as a validator can:

- the core kinds (ConfigMap, DaemonSet, Service) against Kubernetes' own OpenAPI schemas, with
  ``kubernetes-validate`` (PyPI; strict: an unknown field is an error);
- the GIE kinds against the openAPIV3Schema of their CRDs, vendored in tests/data/gie/ from
  kubernetes-sigs/gateway-api-inference-extension release v1.5.0 (commit df9f8909fe06,
  config/crd/bases/), with ``jsonschema``;
- and what ties them together: the node's config is a config steward accepts, the probes ask
  steward's paths for a model it serves, the pool selects the DaemonSet's pods on steward's
  port, and the picker's metric specs name the protocol's gauges for that model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from supervisor.config.checks import check_semantics
from supervisor.config.loading import parse_config
from supervisor.observe.model_server_metrics import KV_CACHE, MODEL_LABEL, QUEUED, RUNNING
from tests.conftest import ROOT

MANIFESTS = ROOT / "deploy" / "kubernetes"
CRDS = Path(__file__).parent / "data" / "gie"
KUBERNETES = "1.33.0"  # the Kubernetes API version the core kinds are checked against
CORE = {("v1", "ConfigMap"), ("apps/v1", "DaemonSet"), ("v1", "Service")}


def documents() -> list[dict[str, Any]]:
    return [doc for path in sorted(MANIFESTS.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]


def find(kind: str, name: str | None = None) -> dict[str, Any]:
    [doc] = [d for d in documents() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return doc


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the CRD's openAPIV3Schema, for every served version."""
    schemas = {}
    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            if version["served"]:
                schemas[f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"]] = \
                    version["schema"]["openAPIV3Schema"]
    return schemas


def test_every_manifest_is_valid_for_its_kind() -> None:
    schemas = crd_schemas()
    kinds = set()
    for doc in documents():
        key = (doc["apiVersion"], doc["kind"])
        kinds.add(key)
        if key in CORE:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        else:
            assert key in schemas, f"{key} is neither a core kind nor a vendored GIE CRD's"
            jsonschema.Draft7Validator(schemas[key]).validate(doc)
    assert kinds == CORE | {("inference.networking.k8s.io/v1", "InferencePool"),
                            ("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective")}


def test_the_validators_refuse_what_they_should() -> None:
    """Neither check passes everything: a misspelt field and a pool without its picker fail."""
    daemonset = find("DaemonSet")
    broken = {**daemonset, "spec": {**daemonset["spec"], "nodeSelektor": {}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)
    pool = find("InferencePool")
    schema = crd_schemas()["inference.networking.k8s.io/v1", "InferencePool"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate({**pool, "spec": {k: v for k, v in pool["spec"].items()
                                                                      if k != "endpointPickerRef"}})


def test_the_node_config_is_one_steward_accepts_and_the_pieces_agree() -> None:
    config_map = find("ConfigMap", "steward-config")
    config = parse_config(yaml.safe_load(config_map["data"]["config.yaml"]))
    assert check_semantics(config) == []
    assert config.listen.port == 8080
    assert "/metrics" in config.auth.open_paths and "/healthz" in config.auth.open_paths

    pod = find("DaemonSet")["spec"]["template"]
    [container] = pod["spec"]["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    readiness = container["readinessProbe"]["httpGet"]["path"]
    prefix, _, model = readiness.rpartition("/")
    assert prefix == "/healthz/models" and model in config.models
    [port] = container["ports"]
    assert port["containerPort"] == config.listen.port
    secret_mount = next(m for m in container["volumeMounts"] if m["name"] == "keys")
    assert config.auth.keys_file.startswith(secret_mount["mountPath"] + "/")

    pool = find("InferencePool")
    assert pool["metadata"]["name"] == model  # one pool per model, named as the model
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert pool["spec"]["targetPorts"] == [{"number": 8080}]
    assert find("InferenceObjective")["spec"]["poolRef"]["name"] == pool["metadata"]["name"]

    picker = yaml.safe_load(find("ConfigMap", f"{model}-epp-config")["data"]["config.yaml"])
    extractor = next(p for p in picker["plugins"] if p["type"] == "core-metrics-extractor")
    [engine] = extractor["parameters"]["engineConfigs"]
    assert pod["metadata"]["labels"]["inference.networking.k8s.io/engine-type"] == engine["name"]
    selector = f"{{{MODEL_LABEL}={model}}}"
    assert (engine["queuedRequestsSpec"], engine["runningRequestsSpec"], engine["kvUsageSpec"]) == (
        QUEUED + selector, RUNNING + selector, KV_CACHE + selector)
    assert engine["loraSpec"] == ""  # steward serves no LoRA adapters
