"""sbatch scripts and the per-process env rule (datarax.launch.slurm).

The script is checked by ``bash -n`` and ``shellcheck`` (Debian's package; the test skips
loudly without it locally and fails under CI=true), then run under a stand-in ``srun`` /
``scontrol`` whose tasks hand the environment they got to JAX's own SLURM detection: what
JAX would resolve must be what :func:`process_env` says.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app.schemas.meshes import MeshPlanRequest
from app.services.hardware import check_hardware_plan, hardware_plan_request, render_hardware_plan
from datarax.errors import PlanError
from datarax.launch import slurm as launch_slurm
from datarax.launch.slurm import PROCESS_LIST_LIMIT, process_env, slurm_script

XLA = "--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_command_buffer=''"
ENV = {"XLA_FLAGS": XLA}
ARGS = ["ici_fsdp_parallelism=8", "dcn_data_parallelism=2", "run_name=it's"]


def hardware_plan(body: dict, plan_id: str = "m_test") -> dict:
    """A stored plan as POST /v1/meshes answers it, from the real planner."""
    request = hardware_plan_request(MeshPlanRequest.model_validate(body))
    rendered = render_hardware_plan(
        check_hardware_plan(request), plan_id=plan_id, created_at="2026-01-01T00:00:00Z"
    )
    return json.loads(rendered.body)


GPU_PLANS = {
    "h100-x2": {"hardware": "h100-sxm", "hosts": 2, "ici": {"data": 8}, "dcn": {"data": 2}},
    "h200-x1": {"hardware": "h200-sxm", "hosts": 1, "ici": {"data": 8}},
    "b200-x4": {"hardware": "b200", "hosts": 4, "ici": {"data": 8}, "dcn": {"data": 4}},
    "gb200-x18": {"hardware": "gb200-nvl72", "hosts": 18, "ici": {"data": 72}},
}


@pytest.fixture(scope="module")
def gpu_plans() -> dict[str, dict]:
    return {key: hardware_plan(body) for key, body in GPU_PLANS.items()}


def script_of(plan: dict, **kwargs) -> str:
    return slurm_script(plan, **{"args": ARGS, "env": ENV, **kwargs})


# ---------------------------------------------------------------------------- the script


@pytest.mark.parametrize("case", list(GPU_PLANS), ids=list(GPU_PLANS))
def test_sbatch_directives(gpu_plans, case) -> None:
    plan = gpu_plans[case]
    gpus = plan["total_devices"] // plan["hosts"]
    script = script_of(plan, name="Sweep #3")
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    directives = [line for line in lines if line.startswith("#SBATCH")]
    assert directives == [
        "#SBATCH --job-name=sweep-3",
        f"#SBATCH --nodes={plan['hosts']}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={gpus}",
        "#SBATCH --exclusive",
    ]
    # sbatch reads directives only before the first command
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert all(lines.index(d) < first_command for d in directives)
    assert f"export JAX_LOCAL_DEVICE_IDS={','.join(map(str, range(gpus)))}" in lines
    assert f"export XLA_FLAGS={shlex.quote(XLA)}" in lines
    assert (
        "srun " in script
        and "maxtext.trainers.pre_train.train src/maxtext/configs/base.yml" in script
    )


def test_bash_parses_the_script(gpu_plans) -> None:
    for plan in gpu_plans.values():
        for image in (None, "nvcr.io/nvidia/jax:25.04-maxtext-py3"):
            done = subprocess.run(
                ["bash", "-n"], input=script_of(plan, image=image), text=True,
                capture_output=True, timeout=30,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr


def test_shellcheck_passes(gpu_plans, tmp_path) -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        message = (
            "shellcheck is not installed "
            "(`make test` installs it as root; or: sudo apt-get install -y shellcheck)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; .ci/run installs it")
        pytest.skip(message)
    for key, plan in gpu_plans.items():
        for image in (None, "nvcr.io/nvidia/jax:25.04-maxtext-py3"):
            path = tmp_path / f"{key}.sbatch"
            path.write_text(script_of(plan, image=image))
            done = subprocess.run(
                [shellcheck, "--shell=bash", "--severity=style", str(path)],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert done.returncode == 0, done.stdout + done.stderr


def test_image_runs_through_pyxis(gpu_plans) -> None:
    script = script_of(gpu_plans["h100-x2"], image="nvcr.io/nvidia/jax:25.04")
    assert "--container-image=nvcr.io/nvidia/jax:25.04" in script
    assert "--container-image" not in script_of(gpu_plans["h100-x2"])


# A stand-in srun: runs the command once per task with the variables SLURM gives a task
# (slurm's srun(1): SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_STEP_NODELIST, ...).
FAKE_SRUN = """\
#!/bin/bash
set -euo pipefail
nodes=1
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in --nodes=*) nodes=${1#--nodes=} ;; esac
  shift
done
for ((rank = 0; rank < nodes; rank++)); do
  SLURM_PROCID=$rank SLURM_LOCALID=0 SLURM_NODEID=$rank SLURM_NTASKS=$nodes \\
    SLURM_STEP_NUM_NODES=$nodes SLURM_STEP_NODELIST=$SLURM_JOB_NODELIST "$@"
done
"""
FAKE_SCONTROL = """\
#!/bin/bash
# scontrol show hostnames node[001-00N]
for ((i = 1; i <= SLURM_NNODES; i++)); do printf 'node%03d\\n' "$i"; done
"""
# Each task: what jax.distributed.initialize would resolve (jax/_src/distributed.py reads
# JAX_COORDINATOR_ADDRESS and JAX_LOCAL_DEVICE_IDS, then asks the SLURM detection).
PROBE = textwrap.dedent("""\
    import json, os, sys
    from jax._src import clusters
    ids = os.environ.get("JAX_LOCAL_DEVICE_IDS")
    local = list(map(int, ids.split(","))) if ids else None
    got = clusters.ClusterEnv.auto_detect_unset_distributed_params(
        os.environ.get("JAX_COORDINATOR_ADDRESS"), None, None, local, "slurm", 10)
    print(json.dumps({"resolved": got, "argv": sys.argv[1:],
                      "env": {k: os.environ.get(k) for k in (
                          "NODE_RANK", "NNODES", "JAX_COORDINATOR_IP", "JAX_COORDINATOR_PORT",
                          "JAX_PROCESS_ID", "JAX_NUM_PROCESSES", "XLA_FLAGS")}}))
    """)


@pytest.mark.parametrize("case", ["h100-x2", "b200-x4"])
def test_script_runs_and_jax_resolves_what_process_env_says(gpu_plans, tmp_path, case) -> None:
    plan = gpu_plans[case]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    hosts = plan["hosts"]
    script = script_of(plan, command=[sys.executable, "-c", PROBE, *ARGS])
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JAX_"))},
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": f"node[001-{hosts:03d}]",
        "SLURM_NNODES": str(hosts),
    }
    done = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=240,
        cwd=Path(__file__).resolve().parents[3],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    tasks = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    expected = process_env(plan)
    assert len(tasks) == expected["num_processes"] == hosts
    for task, process in zip(tasks, expected["processes"], strict=True):
        coordinator, count, pid, local = task["resolved"]
        assert (count, pid, local) == (
            process["num_processes"],
            process["process_id"],
            process["local_device_ids"],
        )
        # on SLURM the coordinator is the first node, on the JobSet's port
        assert coordinator == f"node001:{expected['coordinator_address'].rsplit(':', 1)[1]}"
        assert task["argv"] == ARGS  # quoting survived, "it's" included
        assert task["env"] == {
            "NODE_RANK": str(pid),
            "JAX_PROCESS_ID": str(pid),
            "NNODES": str(hosts),
            "JAX_NUM_PROCESSES": str(hosts),
            "JAX_COORDINATOR_IP": "node001",
            "JAX_COORDINATOR_PORT": "6002",
            "XLA_FLAGS": XLA,
        }


def test_without_local_device_ids_jax_would_take_one_gpu(monkeypatch) -> None:
    """Why the script exports JAX_LOCAL_DEVICE_IDS: JAX's SLURM detection otherwise gives
    each process only GPU SLURM_LOCALID (jax._src.clusters.cluster)."""
    from jax._src import clusters  # noqa: PLC0415

    for key, value in {
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_NODELIST": "node[001-002]",
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0",
    }.items():
        monkeypatch.setenv(key, value)
    _, count, pid, local = clusters.ClusterEnv.auto_detect_unset_distributed_params(
        None, None, None, None, "slurm", 10
    )
    assert (count, pid, local) == (2, 1, [0])


def test_tpu_plans_have_no_slurm_script() -> None:
    plan = hardware_plan({"hardware": "tpu-v5e", "topology": "4x4", "ici": {"data": 16}})
    with pytest.raises(PlanError) as info:
        script_of(plan)
    assert info.value.code == "launch_target_unavailable"
    assert "jobset" in info.value.message


def test_bad_env_names_are_refused(gpu_plans) -> None:
    with pytest.raises(ValueError, match="env name"):
        script_of(gpu_plans["h100-x2"], env={"X; rm -rf /": "1"})
    with pytest.raises(ValueError, match="strings"):
        script_of(gpu_plans["h100-x2"], env={"N": 1})


# ------------------------------------------------------------------------- process_env


def test_small_tpu_plan_lists_each_process() -> None:
    plan = hardware_plan(
        {
            "hardware": "tpu-v5e",
            "topology": "4x4",
            "slices": 2,
            "ici": {"data": 16},
            "dcn": {"data": 2},
        }
    )
    out = process_env(plan)
    assert out["num_processes"] == plan["hosts"] == 8
    assert out["coordinator_address"] == "m-test-slice-0-0.m-test:8482"
    procs = out["processes"]
    assert [p["process_id"] for p in procs] == list(range(8))
    assert [(p["slice"], p["worker"]) for p in procs] == [(s, w) for s in (0, 1) for w in range(4)]
    assert procs[5]["hostname"] == "m-test-slice-1-1.m-test"
    assert all(p["local_device_ids"] is None for p in procs)
    assert all(p["coordinator_address"] == out["coordinator_address"] for p in procs)
    # the rule gives the same values
    rule = out["rule"]
    assert rule["process_id"] == "slice * 4 + worker"
    assert rule["ranges"] == {"slice": [0, 1], "worker": [0, 3]}
    for p in procs:
        assert (
            eval(rule["process_id"], {}, {"slice": p["slice"], "worker": p["worker"]})
            == (  # noqa: S307
                p["process_id"]
            )
        )
        assert rule["hostname"].format(slice=p["slice"], worker=p["worker"]) == p["hostname"]


def test_gpu_plan_is_one_process_per_host(gpu_plans) -> None:
    plan = gpu_plans["gb200-x18"]
    out = process_env(plan, name="nvl")
    assert out["num_processes"] == 18
    assert out["coordinator_address"] == "nvl-host-0-0.nvl:6002"
    assert [p["local_device_ids"] for p in out["processes"]] == [[0, 1, 2, 3]] * 18
    assert out["processes"][17]["hostname"] == "nvl-host-0-17.nvl"
    assert out["rule"]["ranges"] == {"host": [0, 17]}


def test_large_plan_answers_the_rule_only() -> None:
    """A 16,384-host plan (256 v5e pods): the rule, not 16,384 copies."""
    plan = hardware_plan(
        {
            "hardware": "tpu-v5e",
            "topology": "16x16",
            "slices": 256,
            "ici": {"data": 256},
            "dcn": {"data": 256},
        }
    )
    assert plan["hosts"] == 16384
    out = process_env(plan)
    assert out["processes"] is None and out["process_list_limit"] == PROCESS_LIST_LIMIT == 64
    assert out["num_processes"] == out["rule"]["num_processes"] == 16384
    assert out["rule"]["process_id"] == "slice * 64 + worker"
    assert out["rule"]["ranges"] == {"slice": [0, 255], "worker": [0, 63]}
    assert any("16384 processes" in note for note in out["notes"])
    assert len(json.dumps(out.to_json())) < 4000


def test_cut_off_is_inclusive() -> None:
    at = hardware_plan(
        {"hardware": "h100-sxm", "hosts": 64, "ici": {"data": 8}, "dcn": {"data": 64}}
    )
    above = hardware_plan(
        {"hardware": "h100-sxm", "hosts": 65, "ici": {"data": 8}, "dcn": {"data": 65}}
    )
    assert len(process_env(at)["processes"]) == 64
    assert process_env(above)["processes"] is None


@pytest.mark.parametrize(
    "plan",
    [
        {"id": "m_plain", "hardware": None, "axes": {"data": 8}, "total_devices": 8},
        {"id": "m_cpu", "hardware": "cpu", "slices": 1, "hosts": 1, "total_devices": 8},
        {"id": "m_bad", "hardware": "h100-sxm", "slices": 1, "hosts": 2, "total_devices": 8},
    ],
    ids=["no-hardware", "cpu", "devices-disagree"],
)
def test_unlaunchable_plans(plan) -> None:
    for call in (process_env, lambda p: script_of(p)):
        with pytest.raises(PlanError) as info:
            call(plan)
        assert info.value.code == "launch_target_unavailable"


def test_job_name_matches_the_jobset(gpu_plans) -> None:
    from datarax.launch import k8s as launch_k8s  # noqa: PLC0415

    plan = gpu_plans["h100-x2"]
    manifest = launch_k8s.jobset_manifest(plan, args=[], env={}, image="i", name="A/B")
    assert manifest["metadata"]["name"] == launch_slurm.job_name(plan, "A/B") == "a-b"
    assert process_env(plan, name="A/B")["coordinator_address"].startswith("a-b-host-0-0.a-b:")
