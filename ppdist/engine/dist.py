"""Process-group set-up from the launch environment (torchrun, or SLURM as a fallback)."""
from __future__ import annotations

import datetime
import logging
import os
import re
from dataclasses import dataclass
from typing import Any, List, Optional

import torch
import torch.distributed as dist

logger = logging.getLogger("ppdist")


@dataclass
class DistEnv:
    """Where this process sits in the job and which device it uses."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    backend: Optional[str] = None
    object_group: Any = None  # a gloo group for Python-object collectives

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def world_info_from_env() -> tuple:
    """(rank, local_rank, world_size, master_addr) from torchrun's or SLURM's variables."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env.get("LOCAL_RANK", 0)), int(env["WORLD_SIZE"]), env.get("MASTER_ADDR")
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        nodelist = env.get("SLURM_NODELIST", "127.0.0.1")
        return (int(env["SLURM_PROCID"]), int(env.get("SLURM_LOCALID", 0)), int(env["SLURM_NTASKS"]),
                first_slurm_host(nodelist))
    return 0, 0, 1, None


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list such as ``gpu[01-04,07],cpu1`` -> ``gpu01``."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        return "127.0.0.1"
    prefix, ranges = match.groups()
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def init_distributed(use_gpu: bool = True, timeout_s: int = 1800) -> DistEnv:
    """Initialise the default process group if the environment describes a multi-process job.

    NCCL on GPU, gloo on CPU, with an explicit timeout. Without torchrun/SLURM variables the
    same code runs as a single process.
    """
    rank, local_rank, world_size, master_addr = world_info_from_env()
    cuda = use_gpu and torch.cuda.is_available()
    if use_gpu and not torch.cuda.is_available() and rank == 0:
        logger.warning("Global.use_gpu is true but CUDA is not available: training on CPU")
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    env = DistEnv(rank=rank, local_rank=local_rank, world_size=world_size, device=device)
    if world_size == 1:
        return env
    if "MASTER_ADDR" not in os.environ:  # SLURM launch without torchrun
        os.environ["MASTER_ADDR"] = master_addr or "127.0.0.1"
        os.environ.setdefault("MASTER_PORT", "29500")
        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world_size)
    backend = "nccl" if cuda else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        kwargs = {"device_id": device} if cuda else {}
        dist.init_process_group(backend=backend, timeout=timeout, **kwargs)
    env.backend = backend
    env.object_group = dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else None
    return env


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier(group=env.object_group) if env.object_group is not None else dist.barrier()


def all_gather_object(obj: Any, env: DistEnv) -> List[Any]:
    """Every rank's ``obj``, in rank order (over gloo, so GPU memory is not used)."""
    if not env.distributed:
        return [obj]
    out: List[Any] = [None] * env.world_size
    dist.all_gather_object(out, obj, group=env.object_group)
    return out


def broadcast_object(obj: Any, env: DistEnv, src: int = 0) -> Any:
    """``obj`` of rank ``src`` on every rank."""
    if not env.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=env.object_group)
    return box[0]


def all_reduce_sum(values: List[float], env: DistEnv) -> List[float]:
    """Element-wise sum of small float lists over ranks (float64 on CPU/gloo)."""
    if not env.distributed:
        return list(values)
    gathered = all_gather_object(list(values), env)
    return [sum(col) for col in zip(*gathered)]


def cleanup(env: DistEnv) -> None:
    if env.distributed and dist.is_initialized():
        dist.destroy_process_group()
