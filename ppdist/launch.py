"""``python -m ppdist.launch``: Paddle-style launch options, run by torchrun.

For users of ``python -m paddle.distributed.launch --gpus 0,1 --ips ip1,ip2 --log_dir log tools/train.py ...``
(and of ``fleetrun --selected_gpus 0,1 ...``; ``$FLAGS_START_PORT`` is the master port when none is given).
This is not a launcher of its own: it turns the options into torchrun arguments, prints the equivalent
``torchrun`` command (to copy) and runs torchrun in this process (``torch.distributed.run``), with
Paddle's ``log_dir/workerlog.N`` files and an explained error when the nodes do not meet.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import signal
import socket
import sys
from typing import Dict, List, Optional, Sequence

import torch
from torch.distributed import DistError, DistNetworkError
from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs, SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousError
from torch.distributed.launcher.api import elastic_launch


def is_local_address(address: str) -> bool:
    """Whether ``address`` (an IP or a host name) is an address of this machine: can we bind to it?"""
    try:
        infos = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return False
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((sockaddr[0], 0) + tuple(sockaddr[2:]))
            return True
        except OSError:
            continue
    return False


def resolves(address: str) -> bool:
    """Whether ``address`` is an IP address or a host name that resolves."""
    try:
        socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return False
    return True


def node_rank_from_addresses(addresses: Sequence[str]) -> int:
    """The index of the one entry of ``addresses`` that belongs to this machine (ValueError otherwise)."""
    unknown = [address for address in addresses if not resolves(address)]
    if unknown:
        raise ValueError(f"--ips: {', '.join(unknown)} is not an IP address or a known host name")
    if len(addresses) == 1:
        if not is_local_address(addresses[0]):
            raise ValueError(
                f"--ips {addresses[0]} is not an address of this machine ({socket.gethostname()}): one node "
                "runs on this machine; give one of its addresses (or leave --ips out: 127.0.0.1)"
            )
        return 0
    matches = [index for index, address in enumerate(addresses) if is_local_address(address)]
    if len(matches) == 1:
        return matches[0]
    listed = ",".join(addresses)
    if not matches:
        raise ValueError(
            f"none of --ips {listed} is an address of this machine ({socket.gethostname()}); pass --node_rank"
        )
    found = ", ".join(addresses[index] for index in matches)
    raise ValueError(
        f"several of --ips {listed} are addresses of this machine ({found}); "
        "pass --node_rank to say which node this is"
    )


def apply_paddlecloud(ns: argparse.Namespace) -> None:
    """With --use_paddlecloud, fill the node list, this node's address and the port from PaddleCloud's
    environment where it is set, as the Fleet-era launcher did (ValueError when it disagrees with the options)."""
    if not ns.use_paddlecloud:
        return
    trainers, pod_ip, port = (os.environ.get(name) for name in ("PADDLE_TRAINERS", "POD_IP", "PADDLE_PORT"))
    if trainers:
        listed = ",".join(ip.strip() for ip in trainers.split(","))
        if ns.ips is not None and ",".join(ip.strip() for ip in ns.ips.split(",")) != listed:
            raise ValueError(
                f"--cluster_node_ips {ns.ips} differs from PaddleCloud's PADDLE_TRAINERS={trainers}"
            )
        ns.ips = listed
    if pod_ip:
        if ns.node_ip is not None and ns.node_ip != pod_ip:
            raise ValueError(f"--node_ip {ns.node_ip} differs from PaddleCloud's POD_IP={pod_ip}")
        ns.node_ip = pod_ip
    if port and ns.master_port is None and len((ns.ips or "").split(",")) > 1:
        if not port.isdigit():
            raise ValueError(f"PADDLE_PORT={port} is not a port number (1..65535)")
        ns.master_port = int(port)


def node_rank_of_node_ip(
    addresses: Sequence[str], node_ip: Optional[str], node_rank: Optional[int]
) -> Optional[int]:
    """The node rank ``node_ip`` has in ``addresses`` (``node_rank`` when no ``node_ip``); ValueError when it
    is not listed or disagrees with ``node_rank``."""
    if node_ip is None:
        return node_rank
    node_ip = node_ip.strip()
    if node_ip not in addresses:
        raise ValueError(f"--node_ip {node_ip} is not in --cluster_node_ips {','.join(addresses)}")
    place = list(addresses).index(node_ip)
    if node_rank is not None and node_rank != place:
        raise ValueError(f"--node_rank {node_rank} disagrees with --node_ip {node_ip}: node {place} of --ips")
    return place


def check_trainer_id(node_rank: int, addresses: Sequence[str]) -> None:
    """$PADDLE_TRAINER_ID, where set, is this node's place in the node list (ValueError otherwise)."""
    trainer_id = os.environ.get("PADDLE_TRAINER_ID")
    if trainer_id is None or trainer_id.strip() == str(node_rank):
        return
    raise ValueError(
        f"PADDLE_TRAINER_ID={trainer_id} disagrees with this node's place in --cluster_node_ips "
        f"{','.join(addresses)}: node {node_rank} ({addresses[node_rank]})"
    )


def resolve_node_rank(addresses: Sequence[str], node_ip: Optional[str], node_rank: Optional[int]) -> int:
    """This node's rank: --node_rank, else --node_ip's place in the list, else found from this machine's
    addresses; checked against the list's length and $PADDLE_TRAINER_ID (ValueError)."""
    rank = node_rank_of_node_ip(addresses, node_ip, node_rank)
    if rank is None:
        rank = node_rank_from_addresses(addresses)
    if not 0 <= rank < len(addresses):
        raise ValueError(
            f"--node_rank {rank} is out of range: --ips lists {len(addresses)} node(s), "
            f"so it must be in [0, {len(addresses) - 1}]"
        )
    check_trainer_id(rank, addresses)
    return rank


def build_parser() -> argparse.ArgumentParser:
    """The command line, in Paddle's spelling."""
    parser = argparse.ArgumentParser(
        prog="python -m ppdist.launch",
        allow_abbrev=False,
        description="Start TRAINING_SCRIPT on every GPU of this node with torchrun (Paddle-style options). "
        "Run the same command on every node of --ips.",
        epilog="example: python -m ppdist.launch --ips 10.0.0.1,10.0.0.2 --gpus 0,1,2,3 --log_dir log "
        "tools/train.py -c configs/rec/x.yml -o Global.epoch_num=10",
    )
    parser.add_argument(
        "--ips",
        "--cluster_node_ips",
        dest="ips",
        default=None,
        help="comma-separated node addresses; the first is the master (default: 127.0.0.1); "
        "--cluster_node_ips: the Fleet-era launcher's spelling",
    )
    parser.add_argument(
        "--node_ip",
        metavar="IP",
        help="this node's address, one of --ips: its place there is the node rank (the Fleet-era launcher's flag)",
    )
    parser.add_argument(
        "--use_paddlecloud",
        action="store_true",
        help="take the nodes, this node and its rank from PaddleCloud's $PADDLE_TRAINERS, $POD_IP and "
        "$PADDLE_TRAINER_ID (and $PADDLE_PORT as the master port) where they are set",
    )
    procs = parser.add_mutually_exclusive_group()
    procs.add_argument(
        "--gpus",
        "--devices",
        "--selected_gpus",
        "--selected_gpu",
        dest="gpus",
        metavar="IDS",
        help="GPU ids to use on this node, e.g. 0,1,2,3: one process each "
        "(default: all visible GPUs, or 1 process on CPU); --selected_gpus/--selected_gpu: fleetrun's spelling",
    )
    procs.add_argument("--nproc_per_node", type=int, metavar="N", help="number of processes on this node")
    parser.add_argument(
        "--node_rank",
        type=int,
        metavar="R",
        help="index of this node in --ips (default: found from this machine's addresses)",
    )
    parser.add_argument(
        "--master_port",
        type=int,
        metavar="P",
        help="rendezvous port on the master (default: $FLAGS_START_PORT or 29500)",
    )
    parser.add_argument(
        "--log_dir", metavar="DIR", help="write each worker's output to DIR/workerlog.RANK too"
    )
    parser.add_argument(
        "--max_restarts",
        type=int,
        default=0,
        metavar="K",
        help="restart the workers up to K times after a failure (default: %(default)s)",
    )
    parser.add_argument(
        "--elastic",
        action="store_true",
        help="use torchrun's c10d rendezvous (nodes may join late or restart) instead of the static one",
    )
    parser.add_argument(
        "--join_timeout",
        type=int,
        default=600,
        metavar="S",
        help="seconds to wait for all nodes to join (default: %(default)s)",
    )
    parser.add_argument("--dry_run", action="store_true", help="print the torchrun command and exit")
    parser.add_argument("training_script", help="e.g. tools/train.py")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="its arguments, e.g. -c x.yml")
    return parser


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse and check ``argv``; adds ``ip_list``, ``nproc`` and ``visible_devices``, fills defaults."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        apply_paddlecloud(ns)
    except ValueError as exc:
        parser.error(str(exc))
    ns.ips = ns.ips or "127.0.0.1"
    ns.ip_list = [ip.strip() for ip in ns.ips.split(",")]
    if not all(ns.ip_list):
        parser.error(f"--ips {ns.ips}: empty address in the list")
    duplicates = sorted({ip for ip in ns.ip_list if ns.ip_list.count(ip) > 1})
    if duplicates:
        parser.error(f"--ips {ns.ips}: {', '.join(duplicates)} listed more than once (one entry per node)")
    try:
        ns.node_rank = resolve_node_rank(ns.ip_list, ns.node_ip, ns.node_rank)
    except ValueError as exc:
        parser.error(str(exc))
    ns.visible_devices = None
    if ns.gpus is not None:
        ids = [item.strip() for item in ns.gpus.split(",")]
        if not all(item.isdigit() for item in ids) or len(set(ids)) != len(ids):
            parser.error(f"--gpus {ns.gpus}: expected distinct GPU ids such as 0,1,2,3")
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible and not set(ids) <= set(visible.split(",")):
            parser.error(f"--gpus {ns.gpus}: not all of them are in CUDA_VISIBLE_DEVICES={visible}")
        ns.nproc = len(ids)
        ns.visible_devices = ",".join(ids) if torch.cuda.is_available() else None
    elif ns.nproc_per_node is not None:
        if ns.nproc_per_node < 1:
            parser.error("--nproc_per_node must be at least 1")
        ns.nproc = ns.nproc_per_node
    else:
        ns.nproc = torch.cuda.device_count() if torch.cuda.is_available() else 1
    if ns.master_port is None:
        port = os.environ.get("FLAGS_START_PORT") or "29500"
        if not port.isdigit() or not 0 < int(port) < 65536:
            parser.error(f"FLAGS_START_PORT={port} is not a port number (1..65535)")
        ns.master_port = int(port)
    if not 0 < ns.master_port < 65536:
        parser.error(f"--master_port {ns.master_port} is not a port number (1..65535)")
    if ns.max_restarts < 0 or ns.join_timeout < 1:
        parser.error("--max_restarts must be >= 0 and --join_timeout >= 1")
    return ns


def rendezvous_id(ips: Sequence[str], port: int) -> str:
    """$PPDIST_JOB_ID, or an id that every node computes alike from the addresses and the port."""
    digest = hashlib.sha1(f"{','.join(ips)}:{port}".encode()).hexdigest()
    return os.environ.get("PPDIST_JOB_ID") or f"ppdist-{digest[:8]}"


def torchrun_args(ns: argparse.Namespace) -> List[str]:
    """The torchrun arguments (no leading ``torchrun``) for the parsed options, script and its args included."""
    master, port, nnodes = ns.ip_list[0], ns.master_port, len(ns.ip_list)
    if ns.elastic:
        is_host = "true" if ns.node_rank == 0 else "false"
        args = [
            "--nnodes",
            str(nnodes),
            "--nproc_per_node",
            str(ns.nproc),
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            f"{master}:{port}",
            "--rdzv_id",
            rendezvous_id(ns.ip_list, port),
            "--rdzv-conf",
            f"join_timeout={ns.join_timeout},is_host={is_host}",
        ]
    else:
        args = [
            "--nnodes",
            str(nnodes),
            "--node_rank",
            str(ns.node_rank),
            "--master_addr",
            master,
            "--master_port",
            str(port),
            "--nproc_per_node",
            str(ns.nproc),
            "--rdzv-conf",
            f"timeout={ns.join_timeout}",
        ]
    if ns.max_restarts:
        args += ["--max-restarts", str(ns.max_restarts)]
    return args + [ns.training_script] + list(ns.training_script_args)


def launch_env(ns: argparse.Namespace) -> Dict[str, str]:
    """Environment variables for torchrun and the workers (shown before ``torchrun`` in the printed command)."""
    env = {}
    if ns.visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = ns.visible_devices
    return env


class WorkerLogSpecs(LogsSpecs):
    """Paddle's log layout: each worker's output in ``DIR/workerlog.RANK`` (and on the console).

    Each new round of workers (a restart, or with --elastic a change of the nodes) first renames this
    node's logs of the round before to ``workerlog.RANK.attempt{K}``, so ``workerlog.RANK`` is the current one.
    """

    def __init__(self, log_dir: str) -> None:
        os.makedirs(log_dir, exist_ok=True)
        super().__init__(log_dir=log_dir)
        self.round = 0  # how many times reify ran: torchrun's restart count misses membership changes
        self._previous: List[str] = []

    @property
    def root_log_dir(self) -> str:
        return str(self._root_log_dir)

    def reify(self, envs: Dict[int, Dict[str, str]]) -> LogsDest:
        """Log paths per local rank; the workers are told to merge their stderr into stdout."""
        for path in self._previous:
            if os.path.exists(path):
                os.replace(path, f"{path}.attempt{self.round - 1}")
        stdouts: Dict[int, str] = {}
        error_files: Dict[int, str] = {}
        for local_rank, env in envs.items():
            stdouts[local_rank] = os.path.join(self.root_log_dir, f"workerlog.{env.get('RANK', local_rank)}")
            error_dir = os.path.join(
                self.root_log_dir, ".torchelastic", f"attempt_{self.round}", str(local_rank)
            )
            os.makedirs(error_dir, exist_ok=True)
            error_files[local_rank] = os.path.join(error_dir, "error.json")
            if os.path.exists(error_files[local_rank]):  # left by an earlier run in this DIR
                os.remove(error_files[local_rank])
            env["TORCHELASTIC_ERROR_FILE"] = error_files[local_rank]
            env["PPDIST_STDERR_TO_STDOUT"] = "1"
        self._previous, self.round = list(stdouts.values()), self.round + 1
        stderrs = dict.fromkeys(envs, "")  # "": the console
        return LogsDest(stdouts, stderrs, dict(stdouts), {}, error_files, "", "")


def rendezvous_error_message(ns: argparse.Namespace, exc: BaseException) -> str:
    """Why the nodes did not meet, with what to check, for an error raised by the rendezvous."""
    endpoint = f"{ns.ip_list[0]}:{ns.master_port}"
    texts = [" ".join(str(error).split()) for error in (exc, exc.__cause__) if error is not None]
    details = ": ".join(dict.fromkeys(text for text in texts if text)) or type(exc).__name__
    if "EADDRINUSE" in details or "address already in use" in details.lower():
        return (
            f"node {ns.node_rank}: cannot open the rendezvous at {endpoint}: port {ns.master_port} is in use "
            f"({details}). Pick another --master_port, the same on every node."
        )
    if ns.node_rank != 0 and isinstance(exc, (DistNetworkError, RendezvousConnectionError)):
        problem = f"the master node did not join the rendezvous at {endpoint} (could not connect: {details})"
    else:
        problem = (
            f"the other nodes did not join the rendezvous at {endpoint} within {ns.join_timeout} s "
            f"({details})"
        )
    return (
        f"node {ns.node_rank}: {problem}. Check that the same command runs on every node of --ips, "
        f"that {endpoint} is reachable from every node (firewall), and the network interface "
        "(GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)."
    )


def first_exit_code(exc: ChildFailedError) -> int:
    """The exit code of the first worker that failed."""
    return exc.get_first_failure()[1].exitcode


def reported_failure(exc: ChildFailedError, script: str) -> Optional[str]:
    """One line for a worker that stopped on an error ppdist's tools already printed (exit 1, or 2
    for a mistake in the input), instead of torchrun's failure block; None for another exit (a
    crash, a signal), whose block says more."""
    rank, failure = exc.get_first_failure()
    if failure.exitcode not in (1, 2):
        return None
    what = "a mistake in the input" if failure.exitcode == 2 else "an error"
    return (
        f"ppdist.launch: {script} stopped: rank {rank} exited with code {failure.exitcode} ({what}; "
        "its message is above)"
    )


def run_torchrun(args: List[str], log_dir: Optional[str]) -> None:
    """What ``torch.distributed.run.run`` does, with our logs spec when ``log_dir`` is given."""
    getattr(torch.multiprocessing, "_set_thread_name", lambda name: None)("pt_elastic")
    config, entrypoint, cmd_args = torchrun.config_from_args(torchrun.parse_args(args))
    if log_dir:
        config.logs_specs = WorkerLogSpecs(log_dir)
    elastic_launch(config, entrypoint)(*cmd_args)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse, print the torchrun command, run it; 0 on success, 1 when the nodes or the workers fail."""
    ns = parse_args(argv)
    args, env = torchrun_args(ns), launch_env(ns)
    if ns.gpus is not None and ns.visible_devices is None:
        print(f"ppdist.launch: note: no CUDA device here, --gpus {ns.gpus} only sets {ns.nproc} processes")
    prefix = "".join(f"{name}={shlex.quote(value)} " for name, value in env.items())
    print(
        f"ppdist.launch: node {ns.node_rank}/{len(ns.ip_list)}: {prefix}torchrun {shlex.join(args)}",
        flush=True,
    )
    if ns.dry_run:
        return 0
    os.environ.update(env)  # inherited by the workers
    try:
        run_torchrun(args, ns.log_dir)
    except ChildFailedError as exc:
        summary = reported_failure(exc, ns.training_script)
        print(summary or exc.format_msg(), file=sys.stderr)
        return 2 if summary and first_exit_code(exc) == 2 else 1
    except (DistError, RendezvousError, TimeoutError) as exc:
        print(f"ppdist.launch: error: {rendezvous_error_message(ns, exc)}", file=sys.stderr)
        return 1
    except SignalException as exc:  # Ctrl-C or a scheduler's SIGTERM: torchrun has stopped the workers
        print(f"ppdist.launch: stopped by {signal.Signals(exc.sigval).name}", file=sys.stderr)
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
