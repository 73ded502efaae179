"""Process-group set-up from the launch environment (torchrun, or SLURM as a fallback)."""

from __future__ import annotations

import datetime
import gc
import logging
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from ppdist.errors import PPDistError

logger = logging.getLogger("ppdist")
SLURM_PORT_BASE, SLURM_PORT_SPAN = 15000, 20000


class DistributedError(PPDistError):
    """The processes of a job could not meet or lost contact with each other."""


@dataclass
class DistEnv:
    """Where this process sits in the job and which device it uses."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    backend: Optional[str] = None
    object_group: Any = None  # a gloo group for Python-object collectives
    heartbeat_group: Any = None  # a gloo group for rank 0's "still working" beats (see run_on_main)
    cpu_fallback: bool = False  # Global.use_gpu was true but CUDA is not available (see warn_cpu_fallback)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def world_info_from_env() -> tuple:
    """(rank, local_rank, world_size, master_addr) from torchrun's or SLURM's variables.

    torchrun's ``RANK``/``WORLD_SIZE`` win; otherwise an ``srun`` step with several tasks
    (``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS`` or ``SLURM_NTASKS``, ``SLURM_LOCALID``) is used,
    with the first host of the step's node list as the master.
    """
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env.get("LOCAL_RANK", 0)), int(env["WORLD_SIZE"]), env.get("MASTER_ADDR")
    tasks = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or 1)
    if "SLURM_PROCID" in env and tasks > 1:
        nodelist = (
            env.get("SLURM_STEP_NODELIST")
            or env.get("SLURM_JOB_NODELIST")
            or env.get("SLURM_NODELIST")
            or "127.0.0.1"
        )
        return int(env["SLURM_PROCID"]), int(env.get("SLURM_LOCALID", 0)), tasks, first_slurm_host(nodelist)
    return 0, 0, 1, None


def slurm_master_port() -> str:
    """``MASTER_PORT`` if set, else a port derived from ``SLURM_JOB_ID`` (the same on every task,
    different for jobs sharing a node)."""
    if os.environ.get("MASTER_PORT"):
        return os.environ["MASTER_PORT"]
    job = os.environ.get("SLURM_JOB_ID", "0")
    return str(SLURM_PORT_BASE + (int(job) if job.isdigit() else 0) % SLURM_PORT_SPAN)


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
    same code runs as a single process. A rendezvous that does not complete in ``timeout_s``
    raises ``DistributedError`` naming the endpoint.
    """
    rank, local_rank, world_size, master_addr = world_info_from_env()
    cuda = use_gpu and torch.cuda.is_available()
    device = cuda_device_for(local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    env = DistEnv(rank=rank, local_rank=local_rank, world_size=world_size, device=device)
    env.cpu_fallback = use_gpu and not cuda
    if world_size == 1:
        return env
    if "RANK" not in os.environ:  # srun launch without torchrun: env:// needs these
        os.environ.setdefault("MASTER_ADDR", master_addr or "127.0.0.1")
        os.environ["MASTER_PORT"] = slurm_master_port()
        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world_size)
        os.environ["LOCAL_RANK"] = str(local_rank)
    backend = "nccl" if cuda else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        kwargs = {"device_id": device} if cuda else {}
        try:
            if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
                kwargs.update(
                    store=fresh_agent_store(rank, world_size, timeout_s), rank=rank, world_size=world_size
                )
            dist.init_process_group(backend=backend, timeout=timeout, **kwargs)
        except (dist.DistError, RuntimeError, TimeoutError) as exc:
            raise DistributedError(rendezvous_failure_message(exc, rank, world_size, timeout_s)) from None
    env.backend = backend
    env.object_group = dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else None
    return env


def warn_cpu_fallback(env: DistEnv, doing: str = "training") -> None:
    """Log (on rank 0, through the configured ``ppdist`` logger, so also to ``train.log``) that
    ``Global.use_gpu`` asked for CUDA and ``doing`` (``training``, ``evaluating``) runs on CPU."""
    if env.cpu_fallback and env.is_main:
        logger.warning("Global.use_gpu is true but CUDA is not available: %s on CPU", doing)


def cuda_device_for(local_rank: int) -> torch.device:
    """The GPU of a process: its local rank among the GPUs it can see (as torchvision's
    references choose). Under ``srun --gpus-per-task=1`` or ``--gpu-bind`` each task sees only its
    own GPU, so local rank 1 must use device 0, not 1."""
    return torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))


def fresh_agent_store(rank: int, world_size: int, timeout_s: int) -> "dist.Store":
    """torchrun's shared store, under a key prefix that is new for this group of processes.

    torchrun keeps one TCP store for all restarts of a job, so after ``--max-restarts`` a new
    group would find the previous group's process-group keys and try to connect to dead
    processes (pytorch/pytorch#167288). The processes agree on a fresh namespace instead: each
    rank posts a random hello, rank 0 answers every hello with its own random token, and a rank
    accepts only the answer to its own hello, so stale keys are never taken for current ones.
    """
    base = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=False,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    namespace = agree_on_namespace(base, rank, world_size, timeout_s)
    return dist.PrefixStore(f"ppdist/{namespace}/", base)


def agree_on_namespace(
    store: "dist.Store", rank: int, world_size: int, timeout_s: float, poll_s: float = 0.02
) -> str:
    """A token that all ``world_size`` processes of this group receive from rank 0 (see
    ``fresh_agent_store``); raises ``TimeoutError`` naming the missing ranks after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    if rank == 0:
        token = uuid.uuid4().hex
        pending = set(range(1, world_size))
        while pending:
            for peer in sorted(pending):
                if store.check([f"ppdist/joined/{token}/{peer}"]):
                    pending.discard(peer)
                elif store.check([f"ppdist/hello/{peer}"]):
                    hello = store.get(f"ppdist/hello/{peer}").decode()
                    store.set(f"ppdist/ack/{peer}", f"{hello}:{token}")
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"rank(s) {sorted(pending)[:16]} did not join within {timeout_s} s")
            if pending:
                time.sleep(poll_s)
        return token
    hello = uuid.uuid4().hex
    store.set(f"ppdist/hello/{rank}", hello)
    while True:
        if store.check([f"ppdist/ack/{rank}"]):
            answer = store.get(f"ppdist/ack/{rank}").decode()
            if answer.startswith(hello + ":"):
                token = answer.split(":", 1)[1]
                store.set(f"ppdist/joined/{token}/{rank}", "1")
                return token
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 did not answer within {timeout_s} s")
        time.sleep(poll_s)


def rendezvous_failure_message(exc: BaseException, rank: int, world_size: int, timeout_s: int) -> str:
    """What to check when the processes of a job did not all meet."""
    endpoint = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return (
        f"rank {rank}: the {world_size} processes did not all meet at the rendezvous {endpoint} within "
        f"Global.dist_timeout={timeout_s} s ({first_line}). Check that every process was started (srun "
        f"--ntasks / torchrun on every node), that {endpoint} is reachable from all nodes (firewall, port in "
        f"use), and the network interface (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)"
    )


# Substrings of the errors gloo/NCCL/c10d raise when a peer died or stopped answering.
_PEER_FAILURE_MARKERS = (
    "timed out",
    "timeout",
    "connection closed",
    "connection reset",
    "broken pipe",
    "closed by peer",
    "pair closure",
    "nccl",
    "gloo",
    "socket",
    "store",
)


def peer_failure_message(exc: BaseException, timeout_s: Optional[int] = None) -> Optional[str]:
    """A clear message when ``exc`` means another process died or hung, else None."""
    is_dist = isinstance(exc, dist.DistError) or type(exc).__module__.startswith("torch.distributed")
    text = str(exc).strip()
    multi_process = int(os.environ.get("WORLD_SIZE", "1") or 1) > 1  # the group may already be destroyed
    if not is_dist and not (
        isinstance(exc, RuntimeError)
        and multi_process
        and "DataLoader" not in text
        and any(m in text.lower() for m in _PEER_FAILURE_MARKERS)
    ):
        return None
    rank = int(os.environ.get("RANK", 0) or 0)
    first_line = (text.splitlines() or [type(exc).__name__])[0][:300]
    limit = f"Global.dist_timeout={timeout_s} s" if timeout_s else "Global.dist_timeout"
    return (
        f"rank {rank} lost contact with the other processes ({type(exc).__name__}: {first_line}). Another "
        f"process died or stopped responding for longer than {limit}; the first failing rank's output "
        f"(torchrun's summary, or --log_dir/workerlog.N) says why. With -o Global.checkpoints=auto and "
        f"torchrun --max-restarts K the job restarts from its last checkpoint"
    )


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


def gather_object_to_main(obj: Any, env: DistEnv) -> Optional[List[Any]]:
    """Every rank's ``obj`` in rank order on rank 0 (over gloo); None on the other ranks."""
    if not env.distributed:
        return [obj]
    out: Optional[List[Any]] = [None] * env.world_size if env.is_main else None
    dist.gather_object(obj, out, dst=0, group=env.object_group)
    return out


def broadcast_object(obj: Any, env: DistEnv, src: int = 0) -> Any:
    """``obj`` of rank ``src`` on every rank."""
    if not env.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=env.object_group)
    return box[0]


HEARTBEAT_S = 10.0  # rank 0 says "still working" this often
HEARTBEAT_TIMEOUT_S = 120.0  # a rank that hears nothing for this long takes rank 0 for lost
WAIT_REPORT_S = 60.0


def _heartbeat_group(env: DistEnv, timeout_s: float) -> Any:
    if env.heartbeat_group is None:  # every rank reaches this call together (a collective)
        env.heartbeat_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return env.heartbeat_group


def _beat_until(stop: threading.Event, group: Any, interval_s: float) -> None:
    while not stop.wait(interval_s):
        dist.broadcast(torch.zeros(1), src=0, group=group)


def run_on_main(
    work: Callable[[], Any],
    env: DistEnv,
    what: str,
    interval_s: float = HEARTBEAT_S,
    timeout_s: float = HEARTBEAT_TIMEOUT_S,
) -> Any:
    """``work()`` on rank 0 only; every rank returns its result (or raises its error).

    The other ranks wait as long as rank 0 works — a COCO evaluation of an Objects365-size set
    takes longer than any fixed collective timeout — because rank 0 broadcasts a beat every
    ``interval_s`` while it works; a rank that hears nothing for ``timeout_s`` fails with
    ``DistributedError`` instead of waiting for a process that is gone.
    """
    if not env.distributed:
        return work()
    group = _heartbeat_group(env, timeout_s)
    if env.is_main:
        stop = threading.Event()
        beats = threading.Thread(target=_beat_until, args=(stop, group, interval_s), daemon=True)
        beats.start()
        outcome: Tuple[Any, Optional[str]]
        try:
            outcome = (work(), None)
            failure = None
        except Exception as exc:  # the others raise too instead of waiting
            outcome, failure = (None, f"{type(exc).__name__}: {exc}"), exc
        finally:
            stop.set()
            beats.join()
        dist.broadcast(torch.ones(1), src=0, group=group)
        broadcast_object(outcome, env)
        if failure is not None:
            raise failure
        return outcome[0]
    flag, start, reported = torch.zeros(1), time.monotonic(), 0.0
    while True:
        try:
            dist.broadcast(flag, src=0, group=group)
        except (dist.DistError, RuntimeError) as exc:
            raise DistributedError(
                f"rank 0 stopped answering during {what} (no sign of life for {timeout_s:.0f} s): {exc}"
            ) from None
        if flag.item() == 1:
            break
        waited = time.monotonic() - start
        if waited - reported >= WAIT_REPORT_S:
            logger.info("rank %d: waiting for rank 0 (%s) for %.0f s", env.rank, what, waited)
            reported = waited
    result, error = broadcast_object(None, env)
    if error is not None:
        raise DistributedError(f"rank 0 failed during {what}: {error}")
    return result


def broadcast_tensors(tensors: Sequence[torch.Tensor], src: int = 0) -> None:
    """Rank ``src``'s values of ``tensors`` (in place) on every rank: one broadcast per device and
    dtype of one flat tensor, not one per tensor (a model's ~600 BatchNorm buffers: 2-3 calls)."""
    groups: Dict[Tuple[torch.device, torch.dtype], List[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.device, tensor.dtype), []).append(tensor)
    for group in groups.values():
        flat = torch.cat([tensor.detach().reshape(-1) for tensor in group])
        dist.broadcast(flat, src=src)
        parts = flat.split([tensor.numel() for tensor in group])
        torch._foreach_copy_([t.data for t in group], [part.view_as(t) for part, t in zip(parts, group)])


def all_reduce_sum(values: List[float], env: DistEnv) -> List[float]:
    """Element-wise sum of small float lists over ranks (float64 on CPU/gloo)."""
    if not env.distributed:
        return list(values)
    gathered = all_gather_object(list(values), env)
    return [sum(col) for col in zip(*gathered)]


def cleanup(env: DistEnv, wait_for_peers: bool = False) -> None:
    """Destroy the process group. ``wait_for_peers`` (the work ended normally on every process):
    after a barrier, so that no process tears its connections down while another still uses
    them (rank 0 writing the last checkpoint); never after an error, where a failed peer would
    keep the others waiting for the timeout.

    The groups' objects are then let go and collected while the interpreter is whole: a gloo
    group still referenced at exit (here, or by a model's DDP wrapper or SyncBN layers in a
    reference cycle) is destroyed during interpreter finalization, where its worker threads can
    abort the process ("terminate called without an active exception") after a finished run."""
    if env.distributed and dist.is_initialized():
        if wait_for_peers:
            dist.barrier(group=env.object_group)
        dist.destroy_process_group()
        env.object_group = env.heartbeat_group = None
        gc.collect()
