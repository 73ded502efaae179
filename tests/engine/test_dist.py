"""Launch-environment parsing, SLURM fallback, the fresh-namespace handshake and error messages."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist

from ppdist.engine import dist as ppdist_dist
from ppdist.engine.dist import (
    agree_on_namespace,
    cuda_device_for,
    first_slurm_host,
    init_distributed,
    peer_failure_message,
    slurm_master_port,
    world_info_from_env,
)

LAUNCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_LOCALID",
    "SLURM_NODELIST",
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_ID",
)


@pytest.fixture
def clean_env(monkeypatch):
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    "nodelist,host",
    [
        ("gpu[01-04,07],cpu1", "gpu01"),
        ("node-[3-5]", "node-3"),
        ("hostA", "hostA"),
        ("a1,b2", "a1"),
        ("r1n[008-010]", "r1n008"),
    ],
)
def test_first_slurm_host(nodelist, host):
    assert first_slurm_host(nodelist) == host


def test_torchrun_variables_win_over_slurm(clean_env):
    clean_env.setenv("RANK", "3")
    clean_env.setenv("WORLD_SIZE", "8")
    clean_env.setenv("LOCAL_RANK", "1")
    clean_env.setenv("MASTER_ADDR", "10.0.0.1")
    clean_env.setenv("SLURM_PROCID", "0")
    clean_env.setenv("SLURM_NTASKS", "2")
    assert world_info_from_env() == (3, 1, 8, "10.0.0.1")


def test_srun_step_gives_rank_world_and_master(clean_env):
    clean_env.setenv("SLURM_PROCID", "5")
    clean_env.setenv("SLURM_LOCALID", "1")
    clean_env.setenv("SLURM_NTASKS", "16")  # the allocation
    clean_env.setenv("SLURM_STEP_NUM_TASKS", "8")  # this srun step
    clean_env.setenv("SLURM_JOB_NODELIST", "gpu[01-08]")
    clean_env.setenv("SLURM_STEP_NODELIST", "gpu[03-06]")
    assert world_info_from_env() == (5, 1, 8, "gpu03")


def test_single_slurm_task_or_plain_python_is_one_process(clean_env):
    assert world_info_from_env() == (0, 0, 1, None)
    clean_env.setenv("SLURM_PROCID", "0")
    clean_env.setenv("SLURM_NTASKS", "1")
    assert world_info_from_env() == (0, 0, 1, None)


def test_slurm_master_port_is_per_job_unless_set(clean_env):
    clean_env.setenv("SLURM_JOB_ID", "123456")
    assert slurm_master_port() == str(ppdist_dist.SLURM_PORT_BASE + 123456 % ppdist_dist.SLURM_PORT_SPAN)
    clean_env.setenv("MASTER_PORT", "29999")
    assert slurm_master_port() == "29999"


def test_namespace_handshake_ignores_keys_left_by_a_previous_group():
    store = dist.HashStore()
    # what a killed group of 3 left behind in torchrun's shared store
    store.set("ppdist/hello/1", "old-hello-1")
    store.set("ppdist/hello/2", "old-hello-2")
    store.set("ppdist/ack/1", "old-hello-1:old-token")
    store.set("ppdist/ack/2", "old-hello-2:old-token")
    results = {}

    def join(rank):
        results[rank] = agree_on_namespace(store, rank, 3, timeout_s=20, poll_s=0.005)

    threads = [threading.Thread(target=join, args=(rank,)) for rank in (2, 1, 0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == 3 and len(set(results.values())) == 1
    assert results[0] != "old-token"


def test_namespace_handshake_times_out_naming_missing_ranks():
    with pytest.raises(TimeoutError, match=r"rank\(s\) \[1, 2\] did not join within 0.2 s"):
        agree_on_namespace(dist.HashStore(), 0, 3, timeout_s=0.2, poll_s=0.01)


def test_peer_failure_messages(clean_env):
    clean_env.setenv("WORLD_SIZE", "2")
    clean_env.setenv("RANK", "1")
    gloo = RuntimeError(
        "[gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:29581: Connection reset by peer"
    )
    message = peer_failure_message(gloo)
    assert (
        message.startswith("rank 1 lost contact with the other processes")
        and "Global.dist_timeout" in message
    )
    assert peer_failure_message(RuntimeError("shape mismatch: [2, 3] vs [3]")) is None
    assert peer_failure_message(ValueError("timed out")) is None
    assert peer_failure_message(RuntimeError("DataLoader worker (pid 12) timed out")) is None
    clean_env.setenv("WORLD_SIZE", "1")
    assert peer_failure_message(gloo) is None  # a single process has no peers


@pytest.mark.parametrize("visible,local_rank,expected", [(1, 0, 0), (1, 3, 0), (4, 3, 3), (2, 3, 1)])
def test_gpu_is_the_local_rank_among_the_visible_ones(monkeypatch, visible, local_rank, expected):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    assert cuda_device_for(local_rank) == torch.device("cuda", expected)


def test_slurm_task_that_sees_one_gpu_uses_it(clean_env):
    """srun --gpus-per-task=1: task 1 of a node sees one GPU, which is its cuda:0."""
    clean_env.setenv("SLURM_PROCID", "1")
    clean_env.setenv("SLURM_LOCALID", "1")
    clean_env.setenv("SLURM_NTASKS", "1")  # a single task of the step in this test: no process group
    clean_env.setattr(torch.cuda, "is_available", lambda: True)
    clean_env.setattr(torch.cuda, "device_count", lambda: 1)
    chosen = []
    clean_env.setattr(torch.cuda, "set_device", chosen.append)
    env = init_distributed(use_gpu=True)
    assert env.device == torch.device("cuda", 0) and chosen == [torch.device("cuda", 0)]
