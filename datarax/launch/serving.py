"""Launch configs of serving plans (DESIGN v1.4 "Serving plans", issue 57 item 4).

One entry point, :func:`serving_launch_config`, for a stored serving plan (``POST
/v1/meshes`` with ``serving``) and the three serving targets:

- ``vllm``: the ``vllm serve <model>`` command line (:func:`vllm_args`) and its
  environment, on GPU and TPU (vLLM TPU);
- ``jetstream``: MaxText's serving configuration (``key=value`` for
  ``maxtext.inference.maxengine.maxengine_server``, :func:`jetstream_args`), TPU only;
- ``jobset``: a ``jobset.x-k8s.io/v1alpha2`` JobSet (:func:`datarax.launch.k8s.
  jobset_manifest`) running the plan's engine: vLLM (``serving.engine`` ``vllm`` or
  ``tensorrt-llm``, GPU or TPU) or JetStream (``jetstream``, TPU).

How the plan's axes become vLLM's: ``tensor`` -> ``--tensor-parallel-size``, ``stage`` ->
``--pipeline-parallel-size``, ``expert`` -> ``--data-parallel-size`` of the attention with
``--enable-expert-parallel`` (vLLM splits the experts over data x tensor ranks), and the
``data`` replicas -> more data-parallel ranks of a server on one host, or more servers.
A replica within a host: every host runs one server (``servers`` = hosts), its
``--data-parallel-size`` the host's replicas (x ``expert``). A replica over several
hosts: one server per replica over Ray (``--distributed-executor-backend ray``), as
vLLM's multi-node serving does.

Sources (the accepted flags and values, :data:`VLLM_FLAGS`, :data:`VLLM_KV_CACHE_DTYPES`,
:data:`VLLM_QUANTIZATION`): vLLM is not installable here (no CUDA or TPU wheel in this
environment's package lists), so its argument parser is read at the commits named with
each list; tests check every flag and value written against them.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from datarax.answers.launch import JetStreamLaunch, JobSetLaunch, LaunchConfig, VllmLaunch
from datarax.errors import PlanError
from datarax.hardware.chips import get_hardware
from datarax.launch.slurm import process_layout

__all__ = [
    "HF_MODELS",
    "EngineArgs",
    "JETSTREAM_COMMAND",
    "SERVING_TARGETS",
    "VLLM_FLAGS",
    "VLLM_KV_CACHE_DTYPES",
    "VLLM_QUANTIZATION",
    "VLLM_SWITCHES",
    "jetstream_args",
    "serving_launch_config",
    "vllm_args",
]

SERVING_TARGETS: tuple[str, ...] = ("vllm", "jetstream", "jobset")

_HF = "https://huggingface.co/"
HF_MODELS: Mapping[str, str] = MappingProxyType(
    {
        "llama2-7b": "meta-llama/Llama-2-7b-chat-hf",
        "llama2-13b": "meta-llama/Llama-2-13b-chat-hf",
        "llama2-70b": "meta-llama/Llama-2-70b-chat-hf",
        "llama3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
        "llama3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
        "llama3.1-405b": "meta-llama/Llama-3.1-405B-Instruct",
        "mistral-7b": "mistralai/Mistral-7B-Instruct-v0.2",
        "gemma2-9b": "google/gemma-2-9b-it",
        "gemma2-27b": "google/gemma-2-27b-it",
        "mixtral-8x7b": "mistralai/Mixtral-8x7B-Instruct-v0.1",
        "mixtral-8x22b": "mistralai/Mixtral-8x22B-Instruct-v0.1",
        "deepseek3-671b": "deepseek-ai/DeepSeek-V3",
        "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
        "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
        "llama4-17b-16e": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
        "llama4-17b-128e": "meta-llama/Llama-4-Maverick-17B-128E-Instruct",
        "gpt-oss-120b": "openai/gpt-oss-120b",
    }
)
"""Named model -> its Hugging Face repository id, the name ``vllm serve`` takes. Each is
the publisher's model card at ``https://huggingface.co/<id>`` (the instruct/chat release
of the architecture the named model prices: the same shapes as the base weights;
``mistral-7b``'s 32,000-token vocabulary is v0.1/v0.2's, v0.3 has 32,768; MLPerf
Inference serves ``Llama-2-70b-chat-hf``). ``gpt3-175b`` has no published weights, so
vLLM cannot serve it."""

VLLM_ARG_UTILS = (
    "https://github.com/vllm-project/vllm/blob/99d7eb5d6a512cfcc5a2b104f24ebf2d6cda772b/"
    "vllm/engine/arg_utils.py"
)
VLLM_FLAGS: frozenset[str] = frozenset(
    {
        # ModelConfig group
        "--max-model-len",
        "--quantization",
        "--dtype",
        "--served-model-name",
        # ParallelConfig group
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--data-parallel-size",
        "--enable-expert-parallel",
        "--distributed-executor-backend",
        # CacheConfig group
        "--gpu-memory-utilization",
        "--kv-cache-dtype",
        "--block-size",
        "--enable-prefix-caching",
        # SchedulerConfig group
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--enable-chunked-prefill",
    }
)
"""The ``vllm serve`` flags this module writes or lets ``extra_args`` add, each an
``add_argument`` of ``EngineArgs.add_cli_args`` in :data:`VLLM_ARG_UTILS` (vLLM commit
``99d7eb5``; ``--max-model-len``, ``--quantization`` and ``--dtype`` in its ModelConfig
group, the parallel, cache and scheduler flags in theirs)."""

VLLM_SWITCHES: frozenset[str] = frozenset(
    {"--enable-expert-parallel", "--enable-prefix-caching", "--enable-chunked-prefill"}
)
"""The flags of :data:`VLLM_FLAGS` that take no value (``store_true`` or
``BooleanOptionalAction`` in vLLM's parser); the others take one."""

VLLM_KV_CACHE_DTYPES: tuple[str, ...] = (
    "auto",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
)
"""``--kv-cache-dtype``'s choices: ``CacheDType`` in ``vllm/config/cache.py`` at vLLM
commit ``c1d86421174a87056edc90a41dc9942391509e84`` (no int8: an int8 KV cache is
JetStream's, not vLLM's)."""

VLLM_QUANTIZATION: tuple[str, ...] = (
    "awq", "fp8", "ptpc_fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4",
    "bitblas", "gguf", "gptq_marlin_24", "gptq_marlin", "gptq_bitblas", "awq_marlin",
    "gptq", "compressed-tensors", "bitsandbytes", "experts_int8", "ipex", "quark",
    "moe_wna16", "torchao", "inc", "mxfp4", "mxfp8", "petit_nvfp4", "cpu_awq",
)  # fmt: skip
"""``--quantization``'s choices: ``QuantizationMethods`` in
``vllm/model_executor/layers/quantization/__init__.py`` at vLLM commit
``05d909563e1d1ada39a13b67e7b9a4cbca1d6a8e``."""

_VLLM_WEIGHTS: Mapping[str, tuple[str | None, str]] = {
    "bfloat16": (None, ""),
    "float8": (
        "fp8",
        "--quantization fp8 quantizes the bfloat16 checkpoint's weights to FP8 as it loads "
        "them (vLLM's dynamic FP8: Hopper, Ada and later GPUs)",
    ),
    "int8": (
        "compressed-tensors",
        "--quantization compressed-tensors reads an int8 checkpoint (W8A8 or W8A16, as "
        "llm-compressor writes it): vLLM does not quantize to int8 as it loads, so "
        "replace the model with such a checkpoint of it",
    ),
    "int4": (
        "awq",
        "--quantization awq reads a 4-bit AWQ checkpoint: vLLM does not quantize to int4 "
        "as it loads, so replace the model with an AWQ checkpoint of it",
    ),
}
"""``serving.weight_dtype`` -> ``--quantization`` and what it needs."""
_VLLM_KV = {"bfloat16": "auto", "float8": "fp8"}

VLLM_IMAGES = {"gpu": "vllm/vllm-openai:latest", "tpu": "vllm/vllm-tpu:latest"}
"""vLLM's published images (Docker Hub: vLLM's docs, "Using Docker" and "TPU")."""
VLLM_PORT = 8000
"""``vllm serve``'s default port (its ``--port``)."""
JETSTREAM_PORT = 9000
"""The JetStream server's gRPC port (JetStream's default, which MaxText's serving docs
reach)."""
JETSTREAM_COMMAND = [
    "python3",
    "-m",
    "maxtext.inference.maxengine.maxengine_server",
    "src/maxtext/configs/base.yml",
]
"""MaxText's JetStream server (``maxtext/inference/maxengine/maxengine_server.py``, which
MaxText's ``pyconfig`` reads over ``base.yml``), run from a MaxText checkout's root."""

_TRAINING_KEYS = ("remat_policy",)


@dataclass(frozen=True)
class EngineArgs:
    """An engine's arguments for a serving plan: vLLM's flags (``model``: the Hugging Face
    id; ``servers`` of ``hosts_per_server`` hosts each) or MaxText's ``key=value``."""

    args: list[str]
    notes: list[str]
    warnings: list[str]
    model: str = ""
    servers: int = 1
    hosts_per_server: int = 1


def _unavailable(reason: str) -> PlanError:
    return PlanError("launch_target_unavailable", reason)


def _sizes(plan: Mapping[str, Any]) -> dict[str, int]:
    """Each role's size over ici and dcn."""
    ici = plan.get("ici") or {}
    dcn = plan.get("dcn") or {}
    out: dict[str, int] = {}
    for axis in {**ici, **dcn}:
        out[str(axis)] = int(ici.get(axis, 1)) * int(dcn.get(axis, 1))
    return out


class _Layout:
    """The plan's servers: devices per replica, hosts, and how they group."""

    def __init__(self, plan: Mapping[str, Any]) -> None:
        sizes = _sizes(plan)
        self.tensor = sizes.get("tensor", 1)
        self.stage = sizes.get("stage", 1)
        self.expert = sizes.get("expert", 1)
        self.replica_devices = self.tensor * self.stage * self.expert
        processes = process_layout(plan)  # the JobSet's pods: hosts as GKE has them
        self.hosts, self.per_host = processes.hosts, processes.devices_per_host
        self.slices = processes.slices if processes.kind == "tpu" else 1
        self.total = self.hosts * self.per_host
        self.replicas = self.total // self.replica_devices
        if self.replica_devices <= self.per_host:
            if self.per_host % self.replica_devices:
                raise _unavailable(
                    f"a replica of {self.replica_devices} devices does not fill the "
                    f"{self.per_host} devices of a host evenly: vLLM runs one server a host"
                )
            self.servers, self.hosts_per_server = self.hosts, 1
            self.server_replicas = self.per_host // self.replica_devices
        else:
            if self.replica_devices % self.per_host:
                raise _unavailable(
                    f"a replica of {self.replica_devices} devices is not a whole number of "
                    f"hosts of {self.per_host} devices"
                )
            self.hosts_per_server = self.replica_devices // self.per_host
            self.servers, self.server_replicas = self.replicas, 1
            if self.hosts_per_server > self.hosts // self.slices:
                raise _unavailable(
                    f"a replica spans {self.hosts_per_server} hosts, more than a slice's "
                    f"{self.hosts // self.slices}: vLLM's Ray cluster runs within a slice"
                )


def _serving(plan: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    serving, estimate = plan.get("serving"), plan.get("serving_estimate")
    if not isinstance(serving, Mapping) or not isinstance(estimate, Mapping):
        raise _unavailable(
            "vllm and jetstream launch serving plans (POST /v1/meshes with serving); this "
            "plan prices a training step: use target maxtext, jobset, slurm or env"
        )
    return serving, estimate


def _max_len(serving: Mapping[str, Any]) -> int:
    given = serving.get("max_model_len")
    return int(given or int(serving["input_tokens"]) + int(serving["output_tokens"]))


def _hf_model(plan: Mapping[str, Any]) -> str:
    name = (plan.get("model") or {}).get("name")
    if name in HF_MODELS:
        return HF_MODELS[str(name)]
    if name:
        raise _unavailable(
            f"the plan's model {name!r} has no published weights vLLM can load (vLLM "
            f"serves Hugging Face models; named models with weights: {sorted(HF_MODELS)})"
        )
    raise _unavailable(
        "the plan's model has no name, so there is no checkpoint for vLLM to serve: plan "
        f"a named model ({sorted(HF_MODELS)})"
    )


def _flag_key(key: str) -> str:
    return "--" + key.replace("_", "-")


def _vllm_extra(flags: list[str], extra: Sequence[str], notes: list[str]) -> list[str]:
    """``flags`` (``--flag value`` pairs or lone ``--flag``) then each ``extra``
    ``key=value`` as ``--key value``; an extra flag replaces the generated one."""
    pairs: list[list[str]] = []
    for part in flags:
        if part.startswith("--"):
            pairs.append([part])
        else:
            pairs[-1].append(part)
    added: list[list[str]] = []
    for arg in extra:
        key, _, value = arg.partition("=")
        flag = _flag_key(key)
        if flag not in VLLM_FLAGS:
            raise PlanError(
                "invalid_request",
                f"extra_args {arg!r}: {flag} is not one of the vllm serve flags this "
                f"service writes ({sorted(VLLM_FLAGS)}, vLLM's {VLLM_ARG_UTILS})",
            )
        switch = flag in VLLM_SWITCHES
        if (switch and value not in ("", "true")) or (not switch and not value):
            raise PlanError(
                "invalid_request",
                f"extra_args {arg!r}: {flag} "
                + ("is a switch: give it as key=true" if switch else "takes a value"),
            )
        added.append([flag] if switch else [flag, value])
    named = {pair[0] for pair in added}
    for pair in pairs:
        if pair[0] in named:
            notes.append(f"extra_args replaces the generated {' '.join(pair)}")
    kept = [pair for pair in pairs if pair[0] not in named]
    return [part for pair in kept + added for part in pair]


def vllm_args(plan: Mapping[str, Any], extra_args: Sequence[str] = ()) -> EngineArgs:
    """``vllm serve``'s model and flags for a serving plan.

    Returns:
      ``{"model", "args", "servers", "hosts_per_server", "notes", "warnings"}``: the
      Hugging Face id, the flags (each in :data:`VLLM_FLAGS`), how many servers run and
      over how many hosts each.

    Raises:
      PlanError: ``launch_target_unavailable`` for what vLLM cannot run as planned (a
        model without published weights, an int8 KV cache, a replica that splits a
        host unevenly); ``invalid_request`` for an ``extra_args`` flag not in
        :data:`VLLM_FLAGS`.
    """
    serving, estimate = _serving(plan)
    layout = _Layout(plan)
    model = _hf_model(plan)
    hw = get_hardware(plan["hardware"])
    notes: list[str] = []
    warnings: list[str] = []
    kv = serving.get("kv_dtype") or "bfloat16"
    if kv not in _VLLM_KV:
        raise _unavailable(
            f"kv_dtype {kv!r}: vLLM's --kv-cache-dtype takes {list(VLLM_KV_CACHE_DTYPES)} "
            "(no int8); plan kv_dtype float8 or bfloat16 for vLLM, or launch jetstream (TPU)"
        )
    flags = [
        "--tensor-parallel-size", str(layout.tensor),
        "--pipeline-parallel-size", str(layout.stage),
    ]  # fmt: skip
    data = layout.server_replicas * layout.expert
    if data > 1:
        flags += ["--data-parallel-size", str(data)]
    if layout.expert > 1:
        flags.append("--enable-expert-parallel")
        notes.append(
            f"expert {layout.expert}: vLLM splits the experts over all {data} x "
            f"{layout.tensor} data x tensor ranks of a server, its attention over data"
        )
    flags += [
        "--max-model-len", str(_max_len(serving)),
        "--max-num-seqs", str(int(estimate["batch"])),
        "--gpu-memory-utilization", str(float(serving.get("memory_fraction") or 0.9)),
        "--kv-cache-dtype", _VLLM_KV[kv],
    ]  # fmt: skip
    method, needs = _VLLM_WEIGHTS[serving.get("weight_dtype") or "bfloat16"]
    if method:
        flags += ["--quantization", method]
        (notes if method == "fp8" and hw.kind == "gpu" else warnings).append(needs)
    if layout.hosts_per_server > 1:
        flags += ["--distributed-executor-backend", "ray"]
        notes.append(
            f"a replica spans {layout.hosts_per_server} hosts: each of the {layout.servers} "
            "servers is a Ray cluster of its hosts (`ray start --head` on the first, `ray "
            "start --address=<first>:6379` on the others), and the first runs the command"
        )
    elif layout.servers > 1:
        notes.append(
            f"{layout.servers} servers, one a host, each of {layout.server_replicas} "
            f"replicas: put a load balancer in front of their port {VLLM_PORT}"
        )
    if estimate.get("engine") == "tensorrt-llm":
        warnings.append(
            "the plan is priced for TensorRT-LLM; vLLM's throughput differs: plan with "
            "engine vllm to price this launch"
        )
    if model.startswith(("meta-llama/", "mistralai/", "google/")):
        warnings.append(f"{model} is gated on Hugging Face: set HF_TOKEN (extra_env)")
    return EngineArgs(
        args=_vllm_extra(flags, extra_args, notes),
        notes=notes,
        warnings=warnings,
        model=model,
        servers=layout.servers,
        hosts_per_server=layout.hosts_per_server,
    )


def jetstream_args(plan: Mapping[str, Any], extra_args: Sequence[str] = ()) -> EngineArgs:
    """MaxText's JetStream server configuration (``key=value``) for a TPU serving plan:
    the mesh and model keys of :func:`datarax.launch.maxtext.maxtext_args`, then
    ``per_device_batch_size`` (the priced batch over a replica's devices),
    ``max_prefill_predict_length`` (``input_tokens``), ``max_target_length``,
    ``quantization`` and ``quantize_kvcache``/``kv_quant_dtype`` (base.yml's keys).

    Raises:
      PlanError: ``launch_target_unavailable`` on GPU, with pipeline stages or several
        slices, or a float8 weight or KV dtype (MaxText's fp8 is for GPUs; its KV cache
        quantizes to int8 or int4).
    """
    from datarax.launch import maxtext as launch_maxtext  # noqa: PLC0415
    from datarax.launch.config import _with_extra_args  # noqa: PLC0415

    serving, estimate = _serving(plan)
    hw = get_hardware(plan["hardware"])
    if hw.kind != "tpu":
        raise _unavailable(
            f"jetstream serves on TPUs; {hw.name} is a {hw.kind}: use target vllm (or "
            "jobset, which runs vLLM on GPUs)"
        )
    layout = _Layout(plan)
    if layout.stage > 1:
        raise _unavailable("MaxText's JetStream server has no pipeline stages: plan stage 1")
    if layout.slices > 1:
        raise _unavailable(
            "MaxText's JetStream server runs on one slice: plan one slice (and a server per "
            "slice), or launch vllm"
        )
    weights = serving.get("weight_dtype") or "bfloat16"
    kv = serving.get("kv_dtype") or "bfloat16"
    if "float8" in (weights, kv):
        raise _unavailable(
            "MaxText's quantization fp8 is for NVIDIA GPUs (base.yml) and its KV cache "
            "quantizes to int8 or int4: plan weight_dtype and kv_dtype bfloat16, int8 or "
            "int4 for jetstream, or launch vllm"
        )
    base = launch_maxtext.maxtext_args(plan)
    if base["refusal"] is not None:
        raise PlanError("not_launchable", base["refusal"])
    values = dict(arg.split("=", 1) for arg in base["args"])
    for key in _TRAINING_KEYS:
        values.pop(key, None)
    batch = int(estimate["batch"])  # a replica's; MaxText's is over the slice's replicas
    values.update(
        per_device_batch_size=f"{batch / layout.replica_devices:g}",
        max_prefill_predict_length=str(int(serving["input_tokens"])),
        max_target_length=str(_max_len(serving)),
        quantization="" if weights == "bfloat16" else weights,
        quantize_kvcache="false" if kv == "bfloat16" else "true",
    )
    if kv != "bfloat16":
        values["kv_quant_dtype"] = kv
    # training's flags are not written, so neither is what was left out of them
    notes = [n for n in base.get("notes", ()) if not n.startswith("LIBTPU_INIT_ARGS leaves")]
    notes.append(
        "training's LIBTPU_INIT_ARGS are left out; MaxText's serving reads the checkpoint "
        "at load_parameters_path and the tokenizer at tokenizer_path"
    )
    args = _with_extra_args([f"{k}={v}" for k, v in values.items()], extra_args, notes)
    warnings = []
    given = {arg.split("=", 1)[0] for arg in extra_args}
    if "load_parameters_path" not in given:
        warnings.append(
            "no load_parameters_path: the server starts from random weights; add "
            "load_parameters_path=<your MaxText checkpoint> (extra_args)"
        )
    return EngineArgs(args=args, notes=notes, warnings=warnings)


def _service_env(
    plan: Mapping[str, Any], service_url: str | None, extra_env: Mapping[str, str] | None
) -> dict[str, str]:
    env = {}
    if plan.get("id"):
        env["DATARAX_PLAN_ID"] = str(plan["id"])
    if service_url:
        env["DATARAX_URL"] = service_url.rstrip("/")
    env.update(extra_env or {})
    return env


def _ray_script(vllm_command: Sequence[str], hosts_per_server: int) -> str:
    """The pod's script when a server spans hosts: the first pod of each group starts
    Ray's head and the server, the others join it. ``$(VAR)`` is Kubernetes' expansion of
    the container's variables, ``$$`` its escape for a literal ``$``."""
    serve = shlex.join(vllm_command)
    head = "$(JOBSET_NAME)-$(REPLICATED_JOB_NAME)-$JOB_INDEX-$$((i / h * h)).$(JOBSET_NAME)"
    return (
        f"i=$JOB_COMPLETION_INDEX; h={hosts_per_server}; head={head}; "
        "if [ $$((i % h)) -eq 0 ]; then ray start --head --port=6379 && exec "
        f"{serve}; else exec ray start --address=$head:6379 --block; fi"
    )


def _open_port(manifest: Mapping[str, Any], port: int) -> None:
    """The serving container of every pod of ``manifest`` (in place): named ``serve``, its
    port opened, ``JOB_INDEX`` (the JobSet's job index) set for the Ray script."""
    job_index = {"fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/job-index']"}}
    for rjob in manifest["spec"]["replicatedJobs"]:
        pod = rjob["template"]["spec"]["template"]["spec"]
        for container in pod["containers"]:
            container["name"] = "serve"
            container["ports"] = [*container["ports"], {"containerPort": port}]
            container["env"].append({"name": "JOB_INDEX", "valueFrom": job_index})


def serving_launch_config(
    plan: Mapping[str, Any],
    target: str,
    *,
    image: str | None = None,
    command: Sequence[str] | None = None,
    name: str | None = None,
    queue: str | None = None,
    extra_args: Sequence[str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    service_url: str | None = None,
) -> LaunchConfig:
    """The launch config of a stored serving plan for ``target`` (:data:`SERVING_TARGETS`).

    ``extra_args``: ``key=value``, as ``--key value`` flags for vLLM (each in
    :data:`VLLM_FLAGS`), MaxText keys for JetStream; ``extra_env`` and ``service_url`` as
    :func:`datarax.launch.config.launch_config` takes them. ``jobset`` runs the plan's
    ``serving.engine`` (``jetstream``; else vLLM); ``image`` defaults to vLLM's published
    image, or :data:`~datarax.launch.config.DEFAULT_IMAGE` for JetStream (with a warning).

    Raises:
      PlanError: ``launch_target_unavailable`` with the reason (a training plan, a target
        that does not serve on the plan's hardware, what the engine cannot run as
        planned); ``invalid_request`` for a bad ``extra_args`` entry.
    """
    from datarax.launch.config import DEFAULT_IMAGE  # noqa: PLC0415
    from datarax.launch.k8s import jobset_manifest  # noqa: PLC0415

    if target not in SERVING_TARGETS:
        raise _unavailable(
            f"target {target!r} writes a training job; a serving plan launches with "
            f"{list(SERVING_TARGETS)} (or env: its processes' distributed environment)"
        )
    serving, _ = _serving(plan)
    if not plan.get("hardware"):
        raise _unavailable("the plan names no hardware, so there is nothing to launch on")
    kind = get_hardware(plan["hardware"]).kind
    env = _service_env(plan, service_url, extra_env)
    engine = "jetstream" if target == "jetstream" else "vllm"
    if target == "jobset" and serving.get("engine") == "jetstream" and kind == "tpu":
        engine = "jetstream"
    if engine == "jetstream":
        out = jetstream_args(plan, extra_args or ())
        argv = list(command) if command else [*JETSTREAM_COMMAND, *out.args]
        warnings = list(out.warnings)
        if target == "jetstream":
            return JetStreamLaunch(
                target="jetstream",
                args=out.args,
                env=env,
                command=argv,
                notes=out.notes,
                warnings=warnings,
            )
        if image is None:
            warnings.append(
                f"no image was given, so the jobset runs {DEFAULT_IMAGE!r}, which is not a "
                "published image: set image to your MaxText image"
            )
        manifest = jobset_manifest(
            plan, args=[], env=env, image=image or DEFAULT_IMAGE, command=argv, name=name,
            queue=queue,
        )  # fmt: skip
        _open_port(manifest, JETSTREAM_PORT)
        return JobSetLaunch(target="jobset", manifest=manifest, notes=out.notes,
                            warnings=warnings)  # fmt: skip
    out = vllm_args(plan, extra_args or ())
    argv = list(command) if command else ["vllm", "serve", out.model, *out.args]
    if target == "vllm":
        return VllmLaunch(
            target="vllm",
            model=out.model,
            model_source=_HF + out.model,
            args=out.args,
            command=argv,
            env=env,
            servers=out.servers,
            hosts_per_server=out.hosts_per_server,
            flag_source=VLLM_ARG_UTILS,
            notes=out.notes,
            warnings=out.warnings,
        )
    if out.hosts_per_server > 1 and not command:
        argv = ["bash", "-c", _ray_script(argv, out.hosts_per_server)]
    manifest = jobset_manifest(
        plan, args=[], env=env, image=image or VLLM_IMAGES[kind], command=argv, name=name,
        queue=queue,
    )  # fmt: skip
    _open_port(manifest, VLLM_PORT)
    return JobSetLaunch(target="jobset", manifest=manifest, notes=out.notes,
                        warnings=out.warnings)  # fmt: skip
