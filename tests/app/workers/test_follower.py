"""Roles of a multi-host service: which process serves HTTP, and what a follower refuses.

The follower supervising a real runtime in a real group is tested in
``tests/app/runtime/test_group.py``.
"""

from __future__ import annotations

import pytest

from app.core.settings import Settings
from app.runtime.group import process_id_of
from app.workers import follower

GROUP = {"coordinator": "h:1", "num_processes": 2}
SLURM = {
    "SLURM_JOB_ID": "7",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_NTASKS": "2",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"coordinator": "h:1"}, "together"),
        ({"coordinator": "h:1", "num_processes": 2}, "together"),
        ({"num_processes": 2, "process_id": 1}, "together"),
        ({"coordinator": "h:1", "num_processes": 2, "process_id": 2}, "below num_processes"),
    ],
    ids=["coordinator-only", "no-process-id", "no-coordinator", "id-out-of-range"],
)
def test_partial_multihost_settings_are_refused(values, message):
    with pytest.raises(ValueError, match=message):
        Settings(**values)


def test_process_0_and_single_processes_lead():
    assert follower.is_leader(Settings()) and not Settings().multihost
    assert follower.is_leader(Settings(**GROUP, process_id=0))
    assert not follower.is_leader(Settings(**GROUP, process_id=1))
    auto = Settings(distributed=True, process_id=3)
    assert auto.multihost and process_id_of(auto) == 3
    assert not follower.is_leader(auto)


def test_the_process_id_is_detected_when_distributed(monkeypatch):
    auto = Settings(distributed=True)
    for key, value in SLURM.items():
        monkeypatch.setenv(key, value)
    assert follower.is_leader(auto)
    monkeypatch.setenv("SLURM_PROCID", "1")
    assert process_id_of(auto) == 1 and not follower.is_leader(auto)


def test_undetectable_process_id_is_a_clear_error(monkeypatch):
    for key in ("SLURM_JOB_ID", "OMPI_MCA_orte_hnp_uri", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ValueError, match="DATARAX_PROCESS_ID"):
        follower.is_leader(Settings(distributed=True))


def test_a_follower_refuses_to_lead():
    with pytest.raises(ValueError, match="process 0 serves HTTP"):
        follower.run_follower(Settings(**GROUP, process_id=0))
    with pytest.raises(ValueError, match="multi-host"):
        follower.run_follower(Settings())
