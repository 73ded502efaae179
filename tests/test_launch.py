"""python -m ppdist.launch: Paddle-style options turned into torchrun's, worker logs, explained rendezvous errors."""

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from ppdist_testing import HANG_TIMEOUT_S, REPO, child_env

from ppdist import launch

WORKER = textwrap.dedent("""
    import sys
    import torch.distributed as dist
    from ppdist.cli import run_main

    def main():
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        print(f"rank {rank} of {world}")
        print(f"err from {rank}", file=sys.stderr)
        dist.barrier()
        dist.destroy_process_group()

    run_main(main)
""")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No launch-related variables from the outside; whatever main() sets is undone afterwards."""
    for name in (
        "FLAGS_START_PORT",
        "PPDIST_JOB_ID",
        "CUDA_VISIBLE_DEVICES",
        "PADDLE_TRAINER_ID",
        "PADDLE_TRAINERS",
        "POD_IP",
        "PADDLE_PORT",
    ):
        monkeypatch.delenv(name, raising=False)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def args_for(argv):
    return launch.torchrun_args(launch.parse_args(argv))


def parse_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as info:
        launch.parse_args(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


def test_static_rendezvous_args():
    assert args_for(
        [
            "--ips",
            "10.0.0.1,10.0.0.2",
            "--node_rank",
            "1",
            "--nproc_per_node",
            "4",
            "--master_port",
            "12345",
            "train.py",
            "-c",
            "x.yml",
            "-o",
            "A=1",
        ]
    ) == [
        "--nnodes",
        "2",
        "--node_rank",
        "1",
        "--master_addr",
        "10.0.0.1",
        "--master_port",
        "12345",
        "--nproc_per_node",
        "4",
        "--rdzv-conf",
        "timeout=600",
        "train.py",
        "-c",
        "x.yml",
        "-o",
        "A=1",
    ]


def test_script_args_pass_through_even_when_they_look_like_launch_options():
    ns = launch.parse_args(
        ["--nproc_per_node", "1", "train.py", "--ips", "x", "--gpus", "0", "--help", "-o", "A=B"]
    )
    assert (ns.ips, ns.gpus, ns.training_script) == ("127.0.0.1", None, "train.py")
    assert ns.training_script_args == ["--ips", "x", "--gpus", "0", "--help", "-o", "A=B"]


def test_elastic_rendezvous_args_are_the_same_id_on_every_node():
    common = [
        "--ips",
        "10.0.0.1,10.0.0.2",
        "--nproc_per_node",
        "2",
        "--elastic",
        "--max_restarts",
        "2",
        "--join_timeout",
        "300",
    ]
    node0 = args_for(common + ["--node_rank", "0", "train.py", "-c", "x.yml"])
    node1 = args_for(common + ["--node_rank", "1", "train.py", "-c", "x.yml"])
    run_id = launch.rendezvous_id(["10.0.0.1", "10.0.0.2"], 29500)
    assert run_id.startswith("ppdist-") and len(run_id) == len("ppdist-") + 8
    assert node0 == [
        "--nnodes",
        "2",
        "--nproc_per_node",
        "2",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "10.0.0.1:29500",
        "--rdzv_id",
        run_id,
        "--rdzv-conf",
        "join_timeout=300,is_host=true",
        "--max-restarts",
        "2",
        "train.py",
        "-c",
        "x.yml",
    ]
    assert node1 == [item.replace("is_host=true", "is_host=false") for item in node0]


def test_rendezvous_id_from_the_environment(monkeypatch):
    monkeypatch.setenv("PPDIST_JOB_ID", "job42")
    assert "job42" in args_for(["--ips", "10.0.0.1,10.0.0.2", "--node_rank", "0", "--elastic", "t.py"])


def test_port_default_from_flags_start_port(monkeypatch):
    assert "29500" in args_for(["t.py"])
    monkeypatch.setenv("FLAGS_START_PORT", "6070")
    args = args_for(["--ips", "10.0.0.1,10.0.0.2", "--node_rank", "0", "t.py"])
    assert args[args.index("--master_port") + 1] == "6070"
    assert "--master_port" in args_for(["--master_port", "7000", "t.py"])


@pytest.mark.parametrize("flag", ["--selected_gpus", "--selected_gpu"])
def test_fleetrun_selected_gpus_and_flags_start_port(monkeypatch, flag):
    """fleetrun --ips=... --selected_gpu 0,1,2,3 with export FLAGS_START_PORT=17000 (PaddleDetection's docs)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("FLAGS_START_PORT", "17000")
    ns = launch.parse_args(["--ips=10.0.0.1,10.0.0.2", "--node_rank", "1", flag, "0,1,2,3", "t.py", "--eval"])
    assert (ns.nproc, ns.visible_devices) == (4, "0,1,2,3")
    args = launch.torchrun_args(ns)
    assert args[args.index("--master_port") + 1] == "17000"
    assert args[args.index("--nproc_per_node") + 1] == "4" and args[-2:] == ["t.py", "--eval"]
    assert launch.launch_env(ns) == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}


def test_gpus_on_cpu_only_set_the_number_of_processes(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ns = launch.parse_args(["--gpus", "0,1,2", "t.py"])
    assert (ns.nproc, ns.visible_devices) == (3, None)
    assert launch.main(["--gpus", "0,1,2", "--dry_run", "t.py"]) == 0
    out = capsys.readouterr().out
    assert (
        "only sets 3 processes" in out and "CUDA_VISIBLE_DEVICES" not in out and "--nproc_per_node 3" in out
    )
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert launch.parse_args(["t.py"]).nproc == 1


def test_gpus_with_cuda_set_visible_devices(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert launch.main(["--gpus", "2,3", "--master_port", "6000", "--dry_run", "t.py", "-c", "a b.yml"]) == 0
    assert capsys.readouterr().out == (
        "ppdist.launch: node 0/1: CUDA_VISIBLE_DEVICES=2,3 torchrun --nnodes 1 "
        "--node_rank 0 --master_addr 127.0.0.1 --master_port 6000 --nproc_per_node 2 "
        "--rdzv-conf timeout=600 t.py -c 'a b.yml'\n"
    )
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # a dry run changes nothing


def test_elastic_dry_run_is_plain_torchrun_with_c10d(capsys):
    assert launch.main(["--elastic", "--nproc_per_node", "1", "--dry_run", "t.py"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "ppdist.launch: node 0/1: torchrun --nnodes 1 --nproc_per_node 1 --rdzv_backend c10d "
    )
    assert "is_host=true" in out


def test_bad_options_are_clear_errors(monkeypatch, capsys):
    assert "10.0.0.1 listed more than once" in parse_error(
        ["--ips", "10.0.0.1,10.0.0.2,10.0.0.1", "t.py"], capsys
    )
    message = parse_error(["--ips", "10.0.0.1,10.0.0.2", "--node_rank", "2", "t.py"], capsys)
    assert "--node_rank 2 is out of range" in message and "[0, 1]" in message
    message = parse_error(["--ips", "127.0.0.1,127.0.0.2", "t.py"], capsys)
    assert "several of --ips 127.0.0.1,127.0.0.2 are addresses of this machine" in message
    assert "pass --node_rank" in message
    message = parse_error(["--ips", "203.0.113.9,203.0.113.10", "t.py"], capsys)
    assert "none of --ips 203.0.113.9,203.0.113.10 is an address of this machine" in message
    assert "--gpus 0,x" in parse_error(["--gpus", "0,x", "t.py"], capsys)
    assert "not allowed with argument" in parse_error(
        ["--gpus", "0", "--nproc_per_node", "2", "t.py"], capsys
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert "CUDA_VISIBLE_DEVICES=0,1" in parse_error(["--gpus", "1,2", "t.py"], capsys)


def test_an_address_not_of_this_machine_or_not_an_address_is_refused_before_starting(monkeypatch, capsys):
    """One node whose --ips is elsewhere used to wait 600 s for a rendezvous that could not open."""
    message = parse_error(["--ips", "1.2.3", "t.py"], capsys)
    assert "--ips 1.2.3 is not an address of this machine" in message
    message = parse_error(["--ips", "1.2.3.4.5,127.0.0.1", "t.py"], capsys)
    assert "--ips: 1.2.3.4.5 is not an IP address or a known host name" in message
    monkeypatch.setenv("FLAGS_START_PORT", "99999")
    assert "FLAGS_START_PORT=99999 is not a port number (1..65535)" in parse_error(["t.py"], capsys)


def test_fleet_era_single_node_command(monkeypatch):
    """The seed's ``python -m paddle.distributed.launch --selected_gpus 0,...,7 tools/train_multi_machine.py``."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ns = launch.parse_args(
        ["--selected_gpus", "0,1,2,3,4,5,6,7", "tools/train_multi_machine.py", "-c", "x.yml"]
    )
    assert launch.torchrun_args(ns) == [
        "--nnodes",
        "1",
        "--node_rank",
        "0",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        "29500",
        "--nproc_per_node",
        "8",
        "--rdzv-conf",
        "timeout=600",
        "tools/train_multi_machine.py",
        "-c",
        "x.yml",
    ]
    assert launch.launch_env(ns) == {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}


@pytest.mark.parametrize("paddlecloud", [[], ["--use_paddlecloud"]], ids=["plain", "paddlecloud"])
def test_cluster_node_ips_and_node_ip_give_the_node_rank(monkeypatch, paddlecloud):
    """--cluster_node_ips is the node list (master: the first), --node_ip's place in it the node rank;
    --use_paddlecloud without PaddleCloud's environment changes nothing."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    argv = paddlecloud + ["--cluster_node_ips", "10.0.0.1,10.0.0.2", "--node_ip", "10.0.0.2"]
    ns = launch.parse_args(argv + ["--selected_gpus", "0,1", "t.py"])
    args = launch.torchrun_args(ns)
    assert args[:8] == [
        "--nnodes",
        "2",
        "--node_rank",
        "1",
        "--master_addr",
        "10.0.0.1",
        "--master_port",
        "29500",
    ]
    assert args[args.index("--nproc_per_node") + 1] == "2" and launch.launch_env(ns) == {
        "CUDA_VISIBLE_DEVICES": "0,1"
    }
    assert launch.parse_args(argv[:-1] + ["10.0.0.1", "t.py"]).node_rank == 0
    monkeypatch.setenv("PADDLE_TRAINER_ID", "1")  # agrees with the node's place: accepted
    assert launch.parse_args(argv + ["t.py"]).node_rank == 1
    assert launch.parse_args(["--ips", "10.0.0.1,10.0.0.2", "--node_ip", "10.0.0.2", "t.py"]).node_rank == 1


def test_paddlecloud_environment_gives_nodes_node_and_port(monkeypatch):
    """PaddleCloud's PADDLE_TRAINERS (the nodes), POD_IP (this node), PADDLE_TRAINER_ID, PADDLE_PORT."""
    monkeypatch.setenv("PADDLE_TRAINERS", "10.0.0.1,10.0.0.2,10.0.0.3")
    monkeypatch.setenv("POD_IP", "10.0.0.3")
    monkeypatch.setenv("PADDLE_TRAINER_ID", "2")
    monkeypatch.setenv("PADDLE_PORT", "6170")
    args = args_for(["--use_paddlecloud", "--nproc_per_node", "1", "t.py"])
    assert args[:8] == [
        "--nnodes",
        "3",
        "--node_rank",
        "2",
        "--master_addr",
        "10.0.0.1",
        "--master_port",
        "6170",
    ]
    same = [
        "--cluster_node_ips",
        "10.0.0.1,10.0.0.2,10.0.0.3",
        "--node_ip",
        "10.0.0.3",
        "--master_port",
        "7000",
    ]
    args = args_for(["--use_paddlecloud"] + same + ["t.py"])
    assert args[:8] == [
        "--nnodes",
        "3",
        "--node_rank",
        "2",
        "--master_addr",
        "10.0.0.1",
        "--master_port",
        "7000",
    ]


def test_fleet_era_refusals_are_one_line(monkeypatch, capsys):
    def last_line(argv):
        return parse_error(argv, capsys).strip().splitlines()[-1]

    nodes = ["--cluster_node_ips", "10.0.0.1,10.0.0.2"]
    assert last_line(nodes + ["--node_ip", "10.0.0.9", "t.py"]) == (
        "python -m ppdist.launch: error: --node_ip 10.0.0.9 is not in --cluster_node_ips 10.0.0.1,10.0.0.2"
    )
    assert last_line(nodes + ["--node_ip", "10.0.0.2", "--node_rank", "0", "t.py"]) == (
        "python -m ppdist.launch: error: --node_rank 0 disagrees with --node_ip 10.0.0.2: node 1 of --ips"
    )
    monkeypatch.setenv("PADDLE_TRAINER_ID", "0")
    assert last_line(nodes + ["--node_ip", "10.0.0.2", "t.py"]) == (
        "python -m ppdist.launch: error: PADDLE_TRAINER_ID=0 disagrees with this node's place in "
        "--cluster_node_ips 10.0.0.1,10.0.0.2: node 1 (10.0.0.2)"
    )
    monkeypatch.setenv("PADDLE_TRAINER_ID", "1")
    monkeypatch.setenv("PADDLE_TRAINERS", "10.0.0.1,10.0.0.3")
    assert last_line(["--use_paddlecloud"] + nodes + ["t.py"]) == (
        "python -m ppdist.launch: error: --cluster_node_ips 10.0.0.1,10.0.0.2 differs from PaddleCloud's "
        "PADDLE_TRAINERS=10.0.0.1,10.0.0.3"
    )
    monkeypatch.setenv("POD_IP", "10.0.0.3")
    assert last_line(["--use_paddlecloud", "--node_ip", "10.0.0.1", "t.py"]) == (
        "python -m ppdist.launch: error: --node_ip 10.0.0.1 differs from PaddleCloud's POD_IP=10.0.0.3"
    )
    monkeypatch.setenv("PADDLE_PORT", "x")
    assert last_line(["--use_paddlecloud", "t.py"]) == (
        "python -m ppdist.launch: error: PADDLE_PORT=x is not a port number (1..65535)"
    )


def test_node_rank_from_addresses():
    assert launch.node_rank_from_addresses(["203.0.113.9", "127.0.0.1"]) == 1  # 203.0.113.0/24: TEST-NET-3
    assert launch.node_rank_from_addresses(["localhost", "203.0.113.9"]) == 0
    assert launch.node_rank_from_addresses(["localhost"]) == 0
    assert launch.parse_args(["--ips", "203.0.113.9,127.0.0.1", "t.py"]).node_rank == 1


def test_worker_log_specs(tmp_path):
    log_dir = str(tmp_path / "log")
    specs = launch.WorkerLogSpecs(log_dir)
    assert os.path.isdir(log_dir) and specs.root_log_dir == log_dir
    envs = {
        0: {"RANK": "2", "TORCHELASTIC_RESTART_COUNT": "0"},
        1: {"RANK": "3", "TORCHELASTIC_RESTART_COUNT": "0"},
    }
    dest = specs.reify(envs)
    logs = {0: os.path.join(log_dir, "workerlog.2"), 1: os.path.join(log_dir, "workerlog.3")}
    assert dest.stdouts == logs and dest.tee_stdouts == logs
    assert dest.stderrs == {0: "", 1: ""} and dest.tee_stderrs == {}
    assert (dest.filtered_stdout, dest.filtered_stderr) == ("", "")
    for local_rank, env in envs.items():
        error_file = os.path.join(log_dir, ".torchelastic", "attempt_0", str(local_rank), "error.json")
        assert dest.error_files[local_rank] == env["TORCHELASTIC_ERROR_FILE"] == error_file
        assert os.path.isdir(os.path.dirname(error_file))
        assert env["PPDIST_STDERR_TO_STDOUT"] == "1"
    for path in logs.values():  # what the workers of the failed attempt wrote
        with open(path, "w") as handle:
            handle.write("attempt 0\n")

    restart = {
        0: {"RANK": "2", "TORCHELASTIC_RESTART_COUNT": "1"},
        1: {"RANK": "3", "TORCHELASTIC_RESTART_COUNT": "1"},
    }
    dest = specs.reify(restart)
    assert dest.stdouts == logs
    assert sorted(os.listdir(log_dir)) == [".torchelastic", "workerlog.2.attempt0", "workerlog.3.attempt0"]
    with open(os.path.join(log_dir, "workerlog.3.attempt0")) as handle:
        assert handle.read() == "attempt 0\n"
    assert restart[1]["TORCHELASTIC_ERROR_FILE"].endswith(os.path.join("attempt_1", "1", "error.json"))

    with open(logs[0], "w") as handle:  # --elastic: the next round may give this node other ranks
        handle.write("attempt 1\n")
    dest = specs.reify({0: {"RANK": "0"}, 1: {"RANK": "1"}})
    assert dest.stdouts == {0: os.path.join(log_dir, "workerlog.0"), 1: os.path.join(log_dir, "workerlog.1")}
    assert os.path.exists(os.path.join(log_dir, "workerlog.2.attempt1"))
    assert not os.path.exists(logs[0])


def test_stderr_merged_into_stdout_in_order():
    code = (
        "import sys; from ppdist.cli import run_main\n"
        "run_main(lambda: [print('one'), print('two', file=sys.stderr), print('three')] and 0)"
    )
    env = dict(child_env(), PPDIST_STDERR_TO_STDOUT="1")
    result = subprocess.run(
        [sys.executable, "-u", "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr) == ("one\ntwo\nthree\n", "")


def test_rendezvous_error_messages():
    from torch.distributed import DistNetworkError

    node1 = launch.parse_args(
        ["--ips", "10.0.0.1,10.0.0.2", "--node_rank", "1", "--master_port", "6000", "t.py"]
    )
    message = launch.rendezvous_error_message(node1, DistNetworkError("client socket has timed out"))
    assert message.startswith(
        "node 1: the master node did not join the rendezvous at 10.0.0.1:6000 "
        "(could not connect: client socket has timed out). Check that the same command"
    )
    node0 = launch.parse_args(
        ["--ips", "10.0.0.1,10.0.0.2", "--node_rank", "0", "--master_port", "6000", "t.py"]
    )
    message = launch.rendezvous_error_message(node0, DistNetworkError("code: -98, name: EADDRINUSE"))
    assert message.startswith("node 0: cannot open the rendezvous at 10.0.0.1:6000: port 6000 is in use")


def run_launch(args, timeout=HANG_TIMEOUT_S, env=None) -> subprocess.CompletedProcess:
    env = {**child_env(), **(env or {})}
    env.pop("CUDA_VISIBLE_DEVICES", None)  # --gpus must be a subset of it
    return subprocess.run(
        [sys.executable, "-m", "ppdist.launch"] + args,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def worker_script(tmp_path) -> str:
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    return str(path)


@pytest.mark.slow
def test_launch_two_workers_with_log_dir(tmp_path, worker_script):
    log_dir = tmp_path / "log"
    result = run_launch(
        [
            "--ips",
            "127.0.0.1",
            "--node_rank",
            "0",
            "--gpus",
            "0,1",
            "--master_port",
            str(free_port()),
            "--log_dir",
            str(log_dir),
            worker_script,
        ]
    )
    assert result.returncode == 0, f"STDOUT:\n{result.stdout}\nSTDERR:\n{result.stderr}"
    command = [line for line in result.stdout.splitlines() if line.startswith("ppdist.launch: node 0/1: ")]
    assert len(command) == 1 and "torchrun " in command[0] and "--nproc_per_node 2" in command[0]
    assert "rank 1 of 2" in result.stdout  # tee'd to the console
    assert sorted(name for name in os.listdir(log_dir) if name.startswith("workerlog")) == [
        "workerlog.0",
        "workerlog.1",
    ]
    text = (log_dir / "workerlog.1").read_text()
    assert "rank 1 of 2" in text and "err from 1" in text


@pytest.mark.slow
def test_fleet_era_flags_launch_two_workers_on_cpu(worker_script):
    """The seed's spelling runs: --selected_gpus (2 processes on CPU), --cluster_node_ips, --node_ip, --use_paddlecloud."""
    env = {"FLAGS_START_PORT": str(free_port()), "PADDLE_TRAINER_ID": "0"}
    flags = [
        "--use_paddlecloud",
        "--cluster_node_ips",
        "127.0.0.1",
        "--node_ip",
        "127.0.0.1",
        "--selected_gpus",
        "0,1",
    ]
    result = run_launch(flags + [worker_script], env=env)
    assert result.returncode == 0, f"STDOUT:\n{result.stdout}\nSTDERR:\n{result.stderr}"
    assert "--nnodes 1 --node_rank 0 --master_addr 127.0.0.1" in result.stdout
    assert "rank 0 of 2" in result.stdout and "rank 1 of 2" in result.stdout


@pytest.mark.parametrize("elastic", [False, True], ids=["static", "c10d"])
@pytest.mark.slow
def test_peer_that_never_joins_is_explained(worker_script, elastic):
    """Node 0 of two, node 1 never starts. Static: the TCPStore gives up after --join_timeout
    (3 s here); c10d: its join_timeout is honoured as well."""
    port = free_port()
    start = time.monotonic()
    result = run_launch(
        [
            "--ips",
            "127.0.0.1,127.0.0.2",
            "--node_rank",
            "0",
            "--nproc_per_node",
            "1",
            "--master_port",
            str(port),
            "--join_timeout",
            "3",
        ]
        + (["--elastic"] if elastic else [])
        + [worker_script]
    )
    assert result.returncode == 1, f"STDOUT:\n{result.stdout}\nSTDERR:\n{result.stderr}"
    assert time.monotonic() - start < 60
    assert f"127.0.0.1:{port}" in result.stderr and "did not join" in result.stderr
    assert "ppdist.launch: error: node 0: the other nodes did not join the rendezvous" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.slow
def test_busy_port_and_failing_workers(tmp_path, worker_script):
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_launch(
            ["--ips", "127.0.0.1,127.0.0.2", "--node_rank", "0", "--master_port", str(port), worker_script]
        )
    assert result.returncode == 1 and f"port {port} is in use" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr

    mistaken = tmp_path / "mistaken.py"  # a tool that printed its one message and exits 2
    mistaken.write_text("import sys\nprint('ppdist: config error: x', file=sys.stderr)\nsys.exit(2)\n")
    result = run_launch(["--nproc_per_node", "1", "--master_port", str(free_port()), str(mistaken)])
    assert result.returncode == 2 and "exitcode  :" not in result.stderr, result.stderr
    assert result.stderr.count("ppdist: config error: x") == 1
    assert (
        f"ppdist.launch: {mistaken} stopped: rank 0 exited with code 2 (a mistake in the input"
        in result.stderr
    )

    failing = tmp_path / "failing.py"
    failing.write_text("import sys\nsys.exit(3)\n")
    result = run_launch(["--nproc_per_node", "1", "--master_port", str(free_port()), str(failing)])
    assert result.returncode == 1
    assert "failing.py FAILED" in result.stderr and "exitcode  : 3" in result.stderr
    assert "Traceback" not in result.stderr
