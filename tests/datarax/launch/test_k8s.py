"""JobSet manifests of real plans (datarax.launch.k8s), each checked three ways:

- against JobSet's own CRD schema (the ``openAPIV3Schema`` of JobSet v0.12.0, vendored in
  ``tests/vendor/jobset/``), read as Kubernetes reads it: ``nullable``, int-or-string and
  ``x-kubernetes-preserve-unknown-fields`` honoured, and unknown fields refused as the API
  server's strict field validation (kubectl's default since Kubernetes 1.27) refuses them;
  the CRD's CEL rules (``x-kubernetes-validations``) are all immutability rules or about
  fields these manifests leave out (startupPolicy/dependsOn), so none is lost;
- against Kubernetes' own Job and PodTemplate schemas (``kubernetes-validate``, which ships
  them: no network), for the Job template and its pod template;
- against JobSet's webhook rules that the schema cannot say (pod names of DNS-1035 labels
  within 63 characters, ``replicas * parallelism`` within int32);

and then by what each pod would see: the downward API resolved as the kubelet would, fed
to JAX's own TPU cluster detection.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from app.schemas.meshes import MeshPlanRequest
from app.services.hardware import check_hardware_plan, hardware_plan_request, render_hardware_plan
from datarax.errors import PlanError
from datarax.hardware.chips import HARDWARE, get_hardware
from datarax.launch import k8s as launch_k8s
from datarax.launch.slurm import process_env, process_layout

VENDOR = Path(__file__).resolve().parents[2] / "vendor" / "jobset"
JOBSET_RELEASE = "v0.12.0"
SCHEMA_FILE = VENDOR / "jobset.x-k8s.io_jobsets.v1alpha2.openapiv3.json"
KUBERNETES_VERSION = "1.33"
"""Kubernetes schemas kubernetes-validate checks against (GKE's regular channel)."""

DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?\Z")


def hardware_plan(body: dict, plan_id: str = "m_test") -> dict:
    """A stored plan as POST /v1/meshes answers it, from the real planner."""
    request = hardware_plan_request(MeshPlanRequest.model_validate(body))
    rendered = render_hardware_plan(
        check_hardware_plan(request), plan_id=plan_id, created_at="2026-01-01T00:00:00Z"
    )
    return json.loads(rendered.body)


PLANS = {
    "v5e-16x16": {"hardware": "tpu-v5e", "topology": "16x16", "ici": {"data": 16, "model": 16}},
    "v5e-16x16-x2": {
        "hardware": "tpu-v5e",
        "topology": "16x16",
        "slices": 2,
        "ici": {"data": 16, "model": 16},
        "dcn": {"data": 2},
    },
    "v5e-1x1": {"hardware": "tpu-v5e", "topology": "1x1", "ici": {"data": 1}},
    "v5e-2x4": {"hardware": "tpu-v5e", "topology": "2x4", "ici": {"data": 8}},
    "v4-2x2x1": {"hardware": "tpu-v4", "topology": "2x2x1", "ici": {"data": 4}},
    "v4-4x4x4-x4": {
        "hardware": "tpu-v4",
        "topology": "4x4x4",
        "slices": 4,
        "ici": {"data": 64},
        "dcn": {"data": 4},
    },
    "v5p-4x4x8": {"hardware": "tpu-v5p", "topology": "4x4x8", "ici": {"data": 128}},
    "v6e-8x8-x4": {
        "hardware": "tpu-v6e",
        "topology": "8x8",
        "slices": 4,
        "ici": {"data": 8, "model": 8},
        "dcn": {"data": 4},
    },
    "h100-x4": {"hardware": "h100-sxm", "hosts": 4, "ici": {"data": 8}, "dcn": {"data": 4}},
    "h200-x1": {"hardware": "h200-sxm", "hosts": 1, "ici": {"data": 8}},
    "b200-x2": {"hardware": "b200", "hosts": 2, "ici": {"data": 8}, "dcn": {"data": 2}},
    "gb200-x36": {"hardware": "gb200-nvl72", "hosts": 36, "ici": {"data": 72}, "dcn": {"data": 2}},
}
TPU_CASES = [key for key, body in PLANS.items() if body["hardware"].startswith("tpu")]
GPU_CASES = [key for key in PLANS if key not in TPU_CASES]
ARGS = ["ici_fsdp_parallelism=16", "num_slices=1"]
ENV = {"LIBTPU_INIT_ARGS": "--xla_tpu_enable_async_collective_fusion=true"}


@pytest.fixture(scope="module")
def plans() -> dict[str, dict]:
    return {key: hardware_plan(body) for key, body in PLANS.items()}


def manifest_of(plan: dict, **kwargs) -> dict:
    kwargs = {"args": ARGS, "env": ENV, "image": "us-docker.pkg.dev/p/maxtext:1", **kwargs}
    return launch_k8s.jobset_manifest(plan, **kwargs)


# ---------------------------------------------------------------- the CRD's schema, as k8s reads it


def _structural(node):
    """An OpenAPI v3 schema of a CRD as a JSON Schema (draft 7) that accepts what the API
    server would accept with strict field validation."""
    if isinstance(node, list):
        return [_structural(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {
        key: _structural(value)
        for key, value in node.items()
        if not key.startswith("x-kubernetes-") and key != "nullable"
    }
    if "properties" in node:
        out["properties"] = {key: _structural(value) for key, value in node["properties"].items()}
    if node.get("x-kubernetes-int-or-string"):
        # Kubernetes: an integer or a string; the CRD spells it anyOf [integer, string].
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if (
        node.get("type") == "object"
        and "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@pytest.fixture(scope="module")
def jobset_validator() -> jsonschema.Draft7Validator:
    schema = _structural(json.loads(SCHEMA_FILE.read_text()))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def assert_valid_jobset(validator: jsonschema.Draft7Validator, manifest: dict) -> None:
    errors = sorted(validator.iter_errors(manifest), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:10]
    )


def assert_valid_core(manifest: dict) -> None:
    """The replicated job's Job template and pod template against Kubernetes' schemas."""
    for rjob in manifest["spec"]["replicatedJobs"]:
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": f"{manifest['metadata']['name']}-{rjob['name']}-0"},
            "spec": rjob["template"]["spec"],
        }
        kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)
        pod_template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": rjob["name"]},
            "template": rjob["template"]["spec"]["template"],
        }
        kubernetes_validate.validate(pod_template, KUBERNETES_VERSION, strict=True)


def assert_webhook_rules(manifest: dict) -> None:
    """JobSet v0.12.0's webhook (pkg/webhooks/jobset_webhook.go): the longest job and pod
    names (plus the pod's 5-character suffix) are DNS-1035 labels; replicas * parallelism
    fits in int32."""
    name = manifest["metadata"]["name"]
    assert DNS_1035.match(name) and len(name) <= 63, name
    for rjob in manifest["spec"]["replicatedJobs"]:
        spec = rjob["template"]["spec"]
        job = f"{name}-{rjob['name']}-{rjob['replicas'] - 1}"
        pod = f"{job}-{spec['completions'] - 1}-abcde"
        for label in (job, pod):
            assert DNS_1035.match(label) and len(label) <= 63, label
        assert rjob["replicas"] * spec["parallelism"] <= 2**31 - 1


def test_vendored_schema_is_the_pinned_release() -> None:
    readme = (VENDOR / "README.md").read_text()
    assert JOBSET_RELEASE in readme and "f22e565ac3cc3265c7c45ef67ecffdc689af5d77" in readme
    assert "Apache License" in (VENDOR / "LICENSE").read_text()
    schema = json.loads(SCHEMA_FILE.read_text())
    assert schema["description"].startswith("JobSet is the Schema for the jobsets API")
    assert "replicatedJobs" in schema["properties"]["spec"]["properties"]
    assert launch_k8s.API_VERSION == "jobset.x-k8s.io/v1alpha2"


@pytest.mark.parametrize("case", list(PLANS), ids=list(PLANS))
def test_manifest_is_valid(plans, jobset_validator, case) -> None:
    for queue in (None, "team-a"):
        manifest = manifest_of(plans[case], queue=queue)
        assert manifest["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
        assert manifest["kind"] == "JobSet"
        assert_valid_jobset(jobset_validator, manifest)
        assert_valid_core(manifest)
        assert_webhook_rules(manifest)
        # what kubectl would send: the YAML, read back
        assert_valid_jobset(jobset_validator, yaml.safe_load(launch_k8s.to_yaml(manifest)))


def _pod_spec(manifest: dict) -> dict:
    return manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def _mutations():
    def typo(m):
        _pod_spec(m)["containers"][0]["envv"] = []

    def replicas_as_text(m):
        m["spec"]["replicatedJobs"][0]["replicas"] = "2"

    def env_value_not_string(m):
        _pod_spec(m)["containers"][0]["env"].append({"name": "N", "value": 1})

    def bad_quantity(m):
        _pod_spec(m)["containers"][0]["resources"]["limits"]["google.com/tpu"] = "four"

    def no_image_field_name(m):
        del _pod_spec(m)["containers"][0]["name"]

    return {
        "typo": typo,
        "replicas-as-text": replicas_as_text,
        "env-value-not-string": env_value_not_string,
        "bad-quantity": bad_quantity,
        "container-without-name": no_image_field_name,
    }


@pytest.mark.parametrize("mutate", list(_mutations().values()), ids=list(_mutations()))
def test_validators_refuse_broken_manifests(plans, jobset_validator, mutate) -> None:
    """The checks above are not vacuous: each break is caught by the CRD schema."""
    manifest = copy.deepcopy(manifest_of(plans["v5e-16x16-x2"]))
    mutate(manifest)
    assert list(jobset_validator.iter_errors(manifest))


def test_kubernetes_validate_refuses_a_broken_pod_template(plans) -> None:
    manifest = copy.deepcopy(manifest_of(plans["h100-x4"]))
    _pod_spec(manifest)["containers"][0]["envv"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        assert_valid_core(manifest)


# ------------------------------------------------------------------------------------ TPU


def _env(manifest: dict) -> dict[str, dict]:
    return {entry["name"]: entry for entry in _pod_spec(manifest)["containers"][0]["env"]}


@pytest.mark.parametrize(
    ("hardware", "topology", "pods", "chips"),
    [
        # GKE's machine types (Google Cloud, "Plan TPUs in GKE"): v5e and v6e slices of up
        # to 8 chips are single-host (ct5lp-hightpu-1t/4t/8t, ct6e-standard-1t/4t/8t),
        # larger ones 4-chip VMs; v4, v5p and TPU7x VMs hold 4 chips (TPU7x: 8 devices)
        ("tpu-v5e", "1x1", 1, 1), ("tpu-v5e", "2x2", 1, 4), ("tpu-v5e", "2x4", 1, 8),
        ("tpu-v5e", "4x4", 4, 4), ("tpu-v6e", "2x4", 1, 8), ("tpu-v6e", "16x16", 64, 4),
        ("tpu-v4", "2x2x1", 1, 4), ("tpu-v4", "2x2x2", 2, 4), ("tpu-v5p", "2x2x1", 1, 4),
        ("tpu-v5p", "2x2x2", 2, 4), ("tpu7x", "2x2x1", 1, 8), ("tpu7x", "2x2x2", 2, 8),
    ],
)  # fmt: skip
def test_each_tpu_generations_slices_are_the_vms_gke_gives(hardware, topology, pods, chips):
    plan = hardware_plan({"hardware": hardware, "topology": topology, "ici": {"data": -1}})
    layout = process_layout(plan)
    assert (layout.hosts_per_slice, layout.devices_per_host) == (pods, chips)
    manifest = manifest_of(plan)
    job = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["parallelism"] == pods
    limits = _pod_spec(manifest)["containers"][0]["resources"]["limits"]
    # GKE's google.com/tpu counts chips; TPU7x's chips are two JAX devices each
    assert limits == {"google.com/tpu": chips // get_hardware(hardware).devices_per_chip}


@pytest.mark.parametrize("case", TPU_CASES, ids=TPU_CASES)
def test_tpu_jobset_shape(plans, case) -> None:
    plan = plans[case]
    hw = get_hardware(plan["hardware"])
    manifest = manifest_of(plan)
    [rjob] = manifest["spec"]["replicatedJobs"]
    job = rjob["template"]["spec"]
    pod = _pod_spec(manifest)
    [container] = pod["containers"]
    # a v5e/v6e slice of up to 8 chips is one VM (a single-host machine type)
    slice_chips = plan["total_devices"] // plan["slices"]
    single = hw.name in ("tpu-v5e", "tpu-v6e") and slice_chips <= 8
    hosts_per_slice = 1 if single else plan["hosts"] // plan["slices"]
    assert rjob["replicas"] == plan["slices"]
    assert job["parallelism"] == job["completions"] == hosts_per_slice
    assert job["completionMode"] == "Indexed" and job["backoffLimit"] == 0
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": launch_k8s.GKE_ACCELERATORS[hw.name],
        "cloud.google.com/gke-tpu-topology": plan["topology"].split(":")[1],
    }
    chips = slice_chips if single else plan["total_devices"] // plan["hosts"]
    assert chips == (slice_chips if single else min(hw.devices_per_host, plan["total_devices"]))
    assert container["resources"]["limits"] == {"google.com/tpu": chips}
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert manifest["metadata"]["annotations"] == {
        "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"
    }
    assert container["command"] == [
        "python3",
        "-m",
        "maxtext.trainers.pre_train.train",
        "src/maxtext/configs/base.yml",
        *ARGS,
    ]
    env = _env(manifest)
    assert env["LIBTPU_INIT_ARGS"]["value"] == ENV["LIBTPU_INIT_ARGS"]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    megascale = {"MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID"}
    if plan["slices"] > 1:
        assert megascale <= set(env)
        assert env["MEGASCALE_COORDINATOR_ADDRESS"]["value"] == (
            "$(JOBSET_NAME)-$(REPLICATED_JOB_NAME)-0-0.$(JOBSET_NAME)"
        )
        assert env["MEGASCALE_SLICE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == (
            "metadata.labels['jobset.sigs.k8s.io/job-index']"
        )
        assert env["MEGASCALE_NUM_SLICES"]["valueFrom"]["fieldRef"]["fieldPath"] == (
            "metadata.labels['jobset.sigs.k8s.io/replicatedjob-replicas']"
        )
    else:
        assert not megascale & set(env)


def test_accelerator_names_cover_the_catalog() -> None:
    """Every TPU and GPU entry of the catalog has its GKE node label (xpk's names)."""
    launchable = {name for name, hw in HARDWARE.items() if hw.kind in ("tpu", "gpu")}
    assert set(launch_k8s.GKE_ACCELERATORS) == launchable
    assert launch_k8s.GKE_ACCELERATORS["tpu-v5e"] == "tpu-v5-lite-podslice"
    assert launch_k8s.GKE_ACCELERATORS["tpu-v4"] == "tpu-v4-podslice"
    assert launch_k8s.GKE_ACCELERATORS["tpu-v5p"] == "tpu-v5p-slice"
    assert launch_k8s.GKE_ACCELERATORS["tpu-v6e"] == "tpu-v6e-slice"


# --------------------------------------------------------------- what a pod sees at run time


def _pod_metadata(manifest: dict, job_index: int, pod_index: int) -> dict[str, dict[str, str]]:
    """Labels and annotations JobSet v0.12.0 and the Job controller put on a pod
    (jobset_controller.go::labelAndAnnotateObject; batch's completion index)."""
    name = manifest["metadata"]["name"]
    rjob = manifest["spec"]["replicatedJobs"][0]
    keys = {
        "jobset.sigs.k8s.io/jobset-name": name,
        "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
        "jobset.sigs.k8s.io/replicatedjob-replicas": str(rjob["replicas"]),
        "jobset.sigs.k8s.io/job-index": str(job_index),
        "batch.kubernetes.io/job-completion-index": str(pod_index),
    }
    return {"labels": dict(keys), "annotations": dict(keys)}


def resolve_env(manifest: dict, job_index: int, pod_index: int) -> dict[str, str]:
    """The container's environment as the kubelet builds it: fieldRefs from the pod's
    metadata, ``$(VAR)`` from variables defined earlier in the list."""
    meta = _pod_metadata(manifest, job_index, pod_index)
    out: dict[str, str] = {}
    for entry in _pod_spec(manifest)["containers"][0]["env"]:
        if "valueFrom" in entry:
            path = entry["valueFrom"]["fieldRef"]["fieldPath"]
            kind, key = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path).groups()
            out[entry["name"]] = meta[kind][key]
        else:
            out[entry["name"]] = re.sub(
                r"\$\((\w+)\)", lambda m: out.get(m[1], m[0]), entry["value"]
            )
    return out


@pytest.mark.parametrize("case", ["v5e-16x16", "v5e-16x16-x2", "v4-4x4x4-x4", "v5e-2x4"])
def test_jax_tpu_detection_reads_what_process_env_says(plans, monkeypatch, case) -> None:
    """Each pod's resolved env, plus the TPU_WORKER_* variables GKE injects, given to JAX's
    own GKE TPU detection, yields process_env's coordinator, count and ids."""
    from jax._src.clusters import cloud_tpu_cluster  # noqa: PLC0415

    plan = plans[case]
    manifest = manifest_of(plan)
    expected = process_env(plan)
    rule = expected["rule"]
    monkeypatch.setattr(cloud_tpu_cluster, "get_tpu_env_value_from_metadata", lambda _key: None)
    layout = process_layout(plan)  # a v5e 2x4 is one VM: one process, as GKE runs it
    hosts_per_slice = layout.hosts_per_slice
    for process in expected["processes"] or []:
        slice_id, worker = process["slice"], process["worker"]
        env = resolve_env(manifest, slice_id, worker)
        env["TPU_WORKER_ID"] = str(worker)
        env["TPU_WORKER_HOSTNAMES"] = ",".join(
            rule["hostname"].format(slice=slice_id, worker=w) for w in range(hosts_per_slice)
        )
        for key in ("MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID"):
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        cluster = cloud_tpu_cluster.GkeTpuCluster
        assert cluster.get_process_id() == process["process_id"]
        assert cluster.get_process_count() == process["num_processes"] == layout.hosts
        host = env.get("MEGASCALE_COORDINATOR_ADDRESS") or cluster._get_worker_list_in_slice()[0]
        assert f"{host}:{cloud_tpu_cluster.coordinator_port}" == process["coordinator_address"]
        assert process["hostname"] == (
            f"{manifest['metadata']['name']}-slice-{slice_id}-{worker}.{manifest['metadata']['name']}"
        )


@pytest.mark.parametrize("case", GPU_CASES, ids=GPU_CASES)
def test_gpu_jobset_shape_and_env(plans, case) -> None:
    plan = plans[case]
    hw = get_hardware(plan["hardware"])
    manifest = manifest_of(plan, env={"XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler"})
    [rjob] = manifest["spec"]["replicatedJobs"]
    job = rjob["template"]["spec"]
    pod = _pod_spec(manifest)
    [container] = pod["containers"]
    assert rjob["replicas"] == 1
    assert job["parallelism"] == job["completions"] == plan["hosts"]
    assert job["completionMode"] == "Indexed" and job["backoffLimit"] == 0
    assert container["resources"]["limits"] == {"nvidia.com/gpu": hw.devices_per_host}
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-accelerator": launch_k8s.GKE_ACCELERATORS[hw.name]
    }
    assert "annotations" not in manifest["metadata"]
    expected = process_env(plan)
    for process in expected["processes"]:
        env = resolve_env(manifest, 0, process["process_id"])
        assert env["JAX_COORDINATOR_ADDRESS"] == process["coordinator_address"]
        assert int(env["JAX_NUM_PROCESSES"]) == int(env["NNODES"]) == process["num_processes"]
        assert int(env["JAX_PROCESS_ID"]) == int(env["NODE_RANK"]) == process["process_id"]
        ids = [int(i) for i in env["JAX_LOCAL_DEVICE_IDS"].split(",")]
        assert ids == process["local_device_ids"] == list(range(hw.devices_per_host))
        assert env["XLA_FLAGS"] == "--xla_gpu_enable_latency_hiding_scheduler"


# ---------------------------------------------------------------------- names, queue, YAML


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, "m-test"),
        ("My Plan_v2!", "my-plan-v2"),
        ("7b-run", "j7b-run"),
        ("---", "datarax"),
        ("x" * 80, "x" * (63 - len("-slice-1-63-abcde"))),
    ],
    ids=["plan-id", "sanitised", "leading-digit", "nothing-left", "too-long"],
)
def test_names_are_dns_1035_labels(plans, given, expected) -> None:
    manifest = manifest_of(plans["v5e-16x16-x2"], name=given)
    assert manifest["metadata"]["name"] == expected
    assert_webhook_rules(manifest)


def test_plan_name_is_the_default(plans) -> None:
    plan = dict(plans["h100-x4"], name="Llama 8B sweep")
    assert manifest_of(plan)["metadata"]["name"] == "llama-8b-sweep"


def test_large_plan_name_leaves_room_for_pod_names() -> None:
    body = {
        "hardware": "tpu-v5e",
        "topology": "16x16",
        "slices": 256,
        "ici": {"data": 256},
        "dcn": {"data": 256},
    }
    manifest = manifest_of(hardware_plan(body), name="n" * 63)
    assert_webhook_rules(manifest)
    assert manifest["spec"]["replicatedJobs"][0]["replicas"] == 256


def test_queue_sets_the_kueue_label(plans) -> None:
    assert "labels" not in manifest_of(plans["v5e-16x16"])["metadata"]
    labels = manifest_of(plans["v5e-16x16"], queue="tpu-queue")["metadata"]["labels"]
    assert labels == {"kueue.x-k8s.io/queue-name": "tpu-queue"}


def test_command_and_env_given(plans) -> None:
    manifest = manifest_of(plans["h100-x4"], command=["bash", "-c", "nvidia-smi"], env={})
    container = _pod_spec(manifest)["containers"][0]
    assert container["command"] == ["bash", "-c", "nvidia-smi"]
    # a variable given replaces the launcher's of that name, once
    manifest = manifest_of(plans["h100-x4"], env={"JAX_COORDINATOR_PORT": "7000"})
    names = [entry["name"] for entry in _pod_spec(manifest)["containers"][0]["env"]]
    assert names.count("JAX_COORDINATOR_PORT") == 1
    assert resolve_env(manifest, 0, 1)["JAX_COORDINATOR_ADDRESS"].endswith(":7000")


def test_yaml_keeps_key_order_and_round_trips(plans) -> None:
    manifest = manifest_of(plans["v6e-8x8-x4"], queue="q")
    text = launch_k8s.to_yaml(manifest)
    assert text.startswith("apiVersion: jobset.x-k8s.io/v1alpha2\nkind: JobSet\nmetadata:\n")
    assert yaml.safe_load(text) == manifest


# ---------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "plan",
    [
        {"id": "m_plain", "hardware": None, "axes": {"data": 8}, "total_devices": 8},
        {"id": "m_cpu", "hardware": "cpu", "slices": 1, "hosts": 1, "total_devices": 8},
    ],
    ids=["no-hardware", "cpu"],
)
def test_plans_without_accelerators_cannot_launch(plan) -> None:
    with pytest.raises(PlanError) as info:
        manifest_of(plan)
    assert info.value.code == "launch_target_unavailable"


def test_bad_inputs_are_refused(plans) -> None:
    with pytest.raises(ValueError, match="image"):
        manifest_of(plans["v5e-16x16"], image=" ")
    with pytest.raises(ValueError, match="env name"):
        manifest_of(plans["v5e-16x16"], env={"BAD-NAME": "1"})
    broken = dict(plans["v5e-16x16"], hosts=3)
    with pytest.raises(PlanError) as info:
        manifest_of(broken)
    assert info.value.code == "launch_target_unavailable"
