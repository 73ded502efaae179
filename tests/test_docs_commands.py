"""Every shell command of README.md and docs/*.md runs, in reading order, in a fresh copy of the repo.

Each command either runs (with tiny data and schedule overrides appended, so the whole page takes
seconds) and must exit 0 and write the files its page names, or is listed in ``NOT_RUN`` with the
reason. A command in neither list fails the test, so a new docs command is run or explained. A
command written again on a later page (the quick start in README.md and docs/quick_start.md) runs
once, where it first appears.
"""

from __future__ import annotations

import glob
import os
import resource
import subprocess
import sys
import time
from typing import Dict, List, Tuple

import pytest
from docs_commands_testing import DocCommand, extract_commands, fresh_copy, with_overrides
from ppdist_testing import HANG_TIMEOUT_S, REPO

# the PP-YOLOE, Faster R-CNN and Cascade R-CNN quick starts: 16 images of 64 px, one epoch
TINY_DET = [
    "Global.epoch_num=1",
    "Global.print_batch_step=1",
    "Global.synthetic_data.num_train=16",
    "Global.synthetic_data.num_val=4",
    "Global.synthetic_data.image_size=64",
    "Train.loader.batch_size_per_card=4",
    "Train.loader.num_workers=0",
    "Eval.loader.batch_size_per_card=4",
    "Global.plot_curves=false",
    "Global.eval_pictures=false",
]
# tiny versions of the quick starts: a few samples, a few steps, no loader workers (curves and
# evaluation pictures where a command's page shows them: the rec quick start's)
TINY: Dict[str, List[str]] = {
    "configs/rec/quickstart_synth.yml": [
        "Global.epoch_num=1",
        "Global.print_batch_step=2",
        "Global.synthetic_data.num_train=64",
        "Global.synthetic_data.num_val=16",
        "Train.loader.batch_size_per_card=16",
        "Train.loader.num_workers=0",
        "Eval.loader.num_workers=0",
    ],
    "configs/seg/quickstart_synth.yml": [
        "Global.max_iters=2",
        "Global.print_batch_step=1",
        "Global.synthetic_data.num_train=8",
        "Global.synthetic_data.num_val=4",
        "Global.synthetic_data.image_size=64",
        "Train.loader.batch_size_per_card=2",
        "Train.loader.num_workers=0",
        "Global.plot_curves=false",
        "Global.eval_pictures=false",
    ],
    "configs/det/quickstart_synth.yml": TINY_DET,
    "configs/det/faster_rcnn_quickstart_synth.yml": TINY_DET,
    "configs/det/cascade_rcnn_quickstart_synth.yml": TINY_DET,
    "configs/table/quickstart_synth.yml": [
        "Global.synthetic_data.num_train=8",
        "Global.synthetic_data.num_val=4",
    ],
}

NOPIC = ["Global.plot_curves=false", "Global.eval_pictures=false"]

# (a piece of the command's text, the files it must write; globs relative to the copy, extra overrides)
RUN: List[Tuple[str, List[str], List[str]]] = [
    (
        "= python tools/train.py -c configs/rec/quickstart_synth.yml",
        [
            "output/rec/quickstart_synth/" + name
            for name in ("latest.pt", "best_accuracy.pt", "config.yml", "train.log", "curves.png")
        ]
        + ["output/rec/quickstart_synth/eval_pictures/*.png"],
        [],
    ),
    (
        "-o Global.save_model_dir=./output/rec/quickstart_2proc",
        ["output/rec/quickstart_2proc/latest.pt"],
        NOPIC,
    ),
    (
        "ppdist.launch --ips 127.0.0.1",
        ["output/rec/quickstart_launch/latest.pt", "log/workerlog.0", "log/workerlog.1"],
        NOPIC,
    ),
    ("best_accuracy --output_json metrics.json", ["metrics.json"], []),
    (
        "= python tools/train.py -c configs/seg/quickstart_synth.yml",
        ["output/seg/quickstart_synth/best_accuracy.pt"],
        [],
    ),
    (
        "= python tools/train.py -c configs/det/quickstart_synth.yml",
        ["output/det/quickstart_synth/best_accuracy.pt"],
        [],
    ),
    (
        "= python tools/train.py -c configs/det/faster_rcnn_quickstart_synth.yml",
        ["output/det/faster_rcnn_quickstart_synth/best_accuracy.pt"],
        [],
    ),
    (
        "= python tools/train.py -c configs/det/cascade_rcnn_quickstart_synth.yml",
        ["output/det/cascade_rcnn_quickstart_synth/best_accuracy.pt"],
        [],
    ),
    (
        "--output_dir output/inference/rec --check",
        ["output/inference/rec/" + n for n in ("model.onnx", "model.pt", "inference.yml", "characters.txt")],
        [],
    ),
    ("infer.py --model output/inference/rec", [], []),
    ("Global.nan_policy=skip", ["output/seg/workflow/latest.pt"], []),
    (
        "Global.mlflow=true",
        ["output/rec/quickstart_mlflow/mlruns", "output/rec/quickstart_mlflow/profiler/*.json"],
        ["Train.loader.batch_size_per_card=2"]
        + NOPIC,  # 32 steps: the profiled steps 10-20 are inside the run
    ),
    (
        "--nproc_per_node 2 tools/train.py -c configs/det/quickstart_synth.yml",
        ["output/det/quickstart_2proc/latest.pt"],
        [],
    ),
    ("--output_json m.json --output_dir out/ --classwise", ["m.json", "out/bbox.json"], []),
    (
        "--output_dir output/inference/det_quickstart --check",
        ["output/inference/det_quickstart/model.onnx"],
        [],
    ),
    ("--output_dir output/inference/seg_quickstart", ["output/inference/seg_quickstart/inference.yml"], []),
    ("infer.py -c configs/seg/quickstart_synth.yml", [], []),
    (
        "infer.py --model output/inference/seg_quickstart",
        ["output/infer/seg/*.png", "output/infer/seg/*_overlay.jpg"],
        [],
    ),
    ("torchrun --nproc_per_node 2 tools/eval.py -c configs/rec/quickstart_synth.yml", [], []),
    ("-o Global.checkpoints=output/rec/quickstart_synth/latest", [], []),
    ("= python tools/train.py -c configs/rec/quickstart_synth.yml -o Global.checkpoints=auto", [], []),
    (
        "--nproc_per_node 2 tools/train.py -c configs/seg/quickstart_synth.yml",
        ["output/seg/quickstart_2proc/latest.pt"],
        [],
    ),
    ("seg/quickstart_synth/best_accuracy --output_json m.json", [], []),
    ("plot_logs.py output/rec/quickstart_synth output/rec/quickstart_2proc", ["curves.png"], []),
    ("plot_logs.py output/seg/quickstart_synth", ["seg_curves.png"], []),
    ("--num 8 --out browse/det", ["browse/det/*.png"], []),
    ("--out browse/seg", ["browse/seg/*.png"], []),
    ("--out browse/rec", ["browse/rec/*.png"], []),
    ("--out browse/det_eval", ["browse/det_eval/*.png"], []),
    ("rec/quickstart_synth/best_accuracy --output_dir eval_pictures", ["eval_pictures/*.png"], []),
    ("--output_dir eval_pictures/det", ["eval_pictures/det/*.png"], []),
    ("rec_ppocrv3 --out train_data/synth_ppocrv3_preview", ["train_data/synth_ppocrv3_preview/dict.txt"], []),
    ("table --out train_data/synth_table_preview", ["train_data/synth_table_preview/train.txt"], []),
    ("--out browse/table", ["browse/table/samples.png", "browse/table/summary.json"], []),
]

PADDLE = "needs Paddle's files (weights, a Paddle suite's config tree), not in a fresh clone"
MULTI_GPU = "needs several GPUs or nodes"
FULL_DATA = "a real recipe on its full data set (COCO, Cityscapes, MJSynth/SynthText or your own labels)"
BENCH = "a benchmark: minutes to hours at its settings (tests/benchmark covers the tool)"
PPOCRV3_QUICK_START = (
    "the PP-OCRv3 quick start: two SVTR_LCNet models trained together, about 25 minutes on 2 CPU cores"
)
PPOCRV3_TRAINED = "needs the PP-OCRv3 quick start's trained model (" + PPOCRV3_QUICK_START + ")"
SEG_FAMILY_QUICK_START = (
    "a segmentation quick start of 8-14 minutes on 2 CPU cores, on the PP-LiteSeg quick start's data "
    "and trainer (run here); tests/test_seg_configs.py checks its config, test_step_host_syncs.py its step"
)
TABLE_QUICK_START = (
    "the table quick start: SLANet on 48,000 synthetic tables, about 23 minutes on 2 CPU cores "
    "(tests/engine/test_table_training.py trains a tiny SLANet through the same trainer)"
)

# (a piece of the command's text, why it does not run here)
NOT_RUN: List[Tuple[str, str]] = [
    ("pip install -e", "installs packages: the test runs in the installed environment"),
    ("pip install torch", "installs packages: the test runs in the installed environment"),
    ("python -m venv", "creates an environment: the test runs in the installed environment"),
    ("= python -m pytest tests -q -n auto --dist loadfile", "the test suite itself"),
    ("= python -m pytest tests -q -m cuda", "the CUDA test suite: needs a GPU"),
    (
        '= python -m pytest tests -q -n auto --dist loadfile -m "not slow"',
        "the edit loop: the test suite itself",
    ),
    ("[./train_data/train.txt]", "your own PaddleOCR label files"),
    ("eval.py -c configs/det/ppyoloe_crn_s_300e_coco.yml", PADDLE),
    ("--out rec_mv3.pt --strict", PADDLE),
    (
        "= python tools/convert_paddle_weights.py -c configs/rec/rec_mv3_none_bilstm_ctc.yml"
        " --pdparams rec_mv3_none_bilstm_ctc_v2.0_train/best_accuracy.pdparams --out rec_mv3.pt",
        PADDLE,
    ),
    ("--out pp_liteseg_t.yml", PADDLE),
    ("= python tools/train.py -c PaddleDetection/configs/ppyoloe/ppyoloe_crn_s_300e_coco.yml", PADDLE),
    ("--gpus 0,1,2,3 tools/train.py -c PaddleDetection", MULTI_GPU + "; " + PADDLE),
    (
        "--nproc_per_node 4 tools/train.py -c configs/det/ppyoloe_crn_s_300e_coco.yml -o Global.accumulate_steps=2",
        MULTI_GPU + "; " + FULL_DATA,
    ),
    ("--nproc 2 --repeat 3 --json bench.json", BENCH),
    ("-c CFG [-o Key=value ...]", "a synopsis, not a command"),
    ("--json rec.json", BENCH),
    ("--json seg.json", BENCH),
    ("--json det.json", BENCH),
    ("--json rec_overhead.json", BENCH),
    ("rec/quickstart_synth.yml --iters 60 --warmup 5", BENCH),
    ("seg/quickstart_synth.yml --iters 40 --warmup 5", BENCH),
    ("det/quickstart_synth.yml --iters 30 --warmup 5", BENCH),
    ("--synthetic --images 48 --warmup 30", BENCH),
    ("--synthetic --images 2048 --warmup 30", BENCH),
    ("--synthetic --images 512 --repeat 3 --skip eval infer scaling", BENCH + "; needs a GPU"),
    ("--nproc 8 --skip bare loader", BENCH + "; " + MULTI_GPU),
    ("for rule in torch paddle; do", BENCH),
    ("Global.bn_statistics=$rule", BENCH),
    ("= done", BENCH),
    ("git worktree add", "rebuilds an old revision to benchmark it against this one"),
    (
        "--count_ops --count_size 32 100",
        "an operator count of a recipe (tests/benchmark/test_op_count.py runs the tool)",
    ),
    (
        "ocrnet_hrnetw18_cityscapes_1024x512_160k.yml --count_ops",
        "an operator count of a recipe (tests/benchmark/test_op_count.py runs the tool)",
    ),
    ("--input_pipeline --synthetic --images 256", BENCH),
    ("--synthetic --images 256 --warmup 5 --iters 40", BENCH),
    ("ocrnet_hrnetw18_cityscapes_1024x512_160k.yml --step_time", BENCH + "; measured on a GPU"),
    ("--step_time --step_size 640 640", BENCH + "; measured on a GPU"),
    (
        "configs/table/SLANet.yml --step_time",
        BENCH + " (tests/benchmark/test_step_time.py runs the measurement on a tiny detector)",
    ),
    ("= OUT=$OUT bash tools/gpu_session.sh", "the next GPU session: about 10 minutes on a GPU"),
    ("--input_pipeline --synthetic --images 64", BENCH),
    ("--input_pipeline --synthetic --images 512", BENCH),
    (
        "torchrun --nproc_per_node 8 tools/train.py -c configs/det/ppyoloe_crn_s_300e_coco.yml -o Train",
        MULTI_GPU + "; " + FULL_DATA,
    ),
    (
        "torchrun --nproc_per_node 8 tools/train.py -c configs/rec/rec_mv3_none_bilstm_ctc.yml",
        MULTI_GPU + "; " + FULL_DATA,
    ),
    ("CUDA_VISIBLE_DEVICES=0,1,2,3", MULTI_GPU + "; " + FULL_DATA),
    ("--node_rank 0", MULTI_GPU),
    ("--node_rank 1", MULTI_GPU),
    ("--rdzv_id ppyoloe_s_run1", MULTI_GPU),
    ("--ips 10.0.0.1,10.0.0.2", MULTI_GPU),
    (
        "--selected_gpus 0,1,2,3,4,5,6,7 tools/train_multi_machine.py -c x.yml",
        MULTI_GPU + "; x.yml: your config",
    ),
    ("--use_paddlecloud --cluster_node_ips", MULTI_GPU + "; x.yml: your config"),
    (
        "-c cfg.yml",
        "cfg.yml stands for your config; the README's launch command runs the same restartable setup",
    ),
    ("srun python tools/train.py", "a SLURM job script"),
    ("head=$(scontrol", "a SLURM job script"),
    ("srun torchrun", "a SLURM job script"),
    ("export GLOO_SOCKET_IFNAME", "a cluster's network settings"),
    ("export NCCL_SOCKET_IFNAME", "a cluster's network settings"),
    ("export NCCL_IB_HCA", "a cluster's network settings"),
    ("torchrun --local_addr", "a cluster's network settings"),
    ("pretrain_models/rec_mv3", PADDLE),
    ("my_ppyoloe.yml -o Global.pretrained_model=ppyoloe_crn_s_300e_coco.pdparams Architecture", PADDLE),
    (
        "= python tools/train.py -c my_ppyoloe.yml -o Global.pretrained_model=ppyoloe_crn_s_300e_coco.pdparams",
        PADDLE,
    ),
    ("Architecture.Backbone.pretrained=./PP_STDCNet1", PADDLE + "; " + FULL_DATA),
    ("--output_dir output/inference/ppyoloe_s", PADDLE),
    ("paddle_seg/make_fixtures.py", PADDLE),
    ("paddle_det/make_fixtures.py", PADDLE),
    ("paddle_rec/make_fixtures.py", PADDLE),
    ("speed_rec_ppocrv3.py paddle --source", PADDLE),
    ("speed_seg_families.py paddle --source", PADDLE),
    ("speed_seg_families.py ppdist --steps", BENCH),
    ("--source /path/to/PaddleDetection --model faster_rcnn", PADDLE),
    ("speed_faster_rcnn.py ppdist --model faster_rcnn", BENCH),
    ("--source /path/to/PaddleDetection --model cascade_rcnn", PADDLE),
    ("speed_faster_rcnn.py ppdist --model cascade_rcnn", BENCH),
    ("speed_table.py paddle --source", PADDLE),
    ("speed_table.py ppdist --size", BENCH),
    ("paddle_segformer/make_fixtures.py", PADDLE),
    ("paddle_ocrnet/make_fixtures.py", PADDLE),
    (
        "tools/train.py -c configs/seg/segformer_b0_cityscapes_1024x1024_160k.yml",
        MULTI_GPU + "; " + FULL_DATA,
    ),
    (
        "tools/train.py -c configs/seg/ocrnet_hrnetw18_cityscapes_1024x512_160k.yml",
        MULTI_GPU + "; " + FULL_DATA,
    ),
    ("speed_rec_ppocrv3.py ppdist --steps", BENCH),
    ("--out configs/my/ppyoloe_s.yml", PADDLE),
    (
        "= python tools/convert_paddle_config.py"
        " -c PaddleSeg/configs/pp_liteseg/pp_liteseg_stdc1_cityscapes_1024x512_scale0.5_160k.yml",
        PADDLE,
    ),
    ("train.py -c PaddleSeg/configs", PADDLE + "; " + FULL_DATA),
    (
        "= python tools/train.py -c my_config.yml -o Global.pretrained_model=output/rec/quickstart_synth/best_accuracy",
        "my_config.yml stands for your config",
    ),
    ("frozen_stages=2", "my_config.yml stands for your config"),
    ("--nproc_per_node 4 tools/train.py -c configs/seg/pp_liteseg", MULTI_GPU + "; " + FULL_DATA),
    (
        "-c configs/seg/pp_liteseg_stdc1_cityscapes_1024x512_scale0.5_160k.yml -o Global.checkpoints",
        FULL_DATA,
    ),
    (
        "= python tools/train.py -c configs/seg/quickstart_segformer_synth.yml",
        SEG_FAMILY_QUICK_START,
    ),
    ("= python tools/train.py -c configs/seg/quickstart_ocrnet_synth.yml", SEG_FAMILY_QUICK_START),
    ("= python tools/train.py -c configs/rec/PP-OCRv3/quickstart_synth.yml", PPOCRV3_QUICK_START),
    ("eval.py -c configs/rec/PP-OCRv3/quickstart_synth.yml", PPOCRV3_TRAINED),
    ("--output_dir output/inference/ppocrv3", PPOCRV3_TRAINED),
    ("Architecture.Models.Teacher.freeze_params=true", PADDLE + "; " + FULL_DATA),
    ("Global.pretrained_model=./ch_PP-OCRv3_rec_train/best_accuracy", PADDLE + "; " + FULL_DATA),
    ("Global.checkpoints=./ch_PP-OCRv3_rec_student/best_accuracy", PADDLE),
    ("--gpus 0,1,2,3 tools/train.py -c configs/rec/PP-OCRv3", MULTI_GPU + "; " + FULL_DATA),
    ("= python tools/train.py -c configs/table/quickstart_synth.yml", TABLE_QUICK_START),
    (
        "= python tools/eval.py -c configs/table/quickstart_synth.yml "
        "-o Global.checkpoints=output/table/quickstart_synth/best_accuracy",
        "needs the table quick start's trained model",
    ),
    ("--output_dir eval_pictures/table", "needs the table quick start's trained model"),
    ("benchmark.py -c configs/table/quickstart_synth.yml", BENCH),
    ("benchmark.py -c configs/table/SLANet.yml --synthetic", BENCH),
    ("--output_dir output/inference/table_quickstart", "needs the table quick start's trained model"),
    ("infer.py -c configs/table/quickstart_synth.yml", "needs the table quick start's trained model"),
    ("--model output/inference/table_quickstart", "needs the table quick start's trained model"),
    ("--nproc_per_node 8 tools/train.py -c configs/table/SLANet.yml", MULTI_GPU + "; " + FULL_DATA),
    ("train.py -c PaddleOCR/configs/table/SLANet.yml", PADDLE + "; " + FULL_DATA),
]


def unique_commands(commands: List[DocCommand]) -> List[DocCommand]:
    """Commands in order, each text once (where it first appears)."""
    seen = set()
    unique = []
    for command in commands:
        if command.text not in seen:
            seen.add(command.text)
            unique.append(command)
    return unique


def matches(piece: str, text: str) -> bool:
    """``= text`` matches that whole command, any other piece a command that contains it."""
    return text == piece[2:] if piece.startswith("= ") else piece in text


def classify(commands: List[DocCommand]) -> Dict[DocCommand, Tuple[str, int]]:
    """Each command's entry: ``("run", index in RUN)`` or ``("skip", index in NOT_RUN)``. Fails
    unless every command matches exactly one entry and every entry exactly one command."""
    entries = [("run", i, piece) for i, (piece, _, _) in enumerate(RUN)]
    entries += [("skip", i, piece) for i, (piece, _) in enumerate(NOT_RUN)]
    chosen: Dict[DocCommand, Tuple[str, int]] = {}
    problems = []
    for command in commands:
        found = [e for e in entries if matches(e[2], command.text)]
        if len(found) != 1:
            what = "neither run nor listed in NOT_RUN" if not found else f"matched by {[e[2] for e in found]}"
            problems.append(f"{command.where}: {what}: {command.text}")
            continue
        chosen[command] = found[0][:2]
    for _, _, piece in entries:
        count = sum(1 for c in commands if matches(piece, c.text))
        if count != 1:
            problems.append(f"entry {piece!r} matches {count} docs commands instead of one")
    assert not problems, "\n".join(problems)
    return chosen


def test_every_docs_command_is_run_or_listed():
    classify(unique_commands(extract_commands(REPO)))


def test_commands_are_read_from_shell_fences_in_order_and_a_new_one_fails(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "```bash\n# a comment\npython tools/a.py -c x.yml \\\n    -o 'K=#1'   # why\n\n```\n"
        "```text\npython tools/not_a_command.py\n```\n"
    )
    (tmp_path / "docs" / "b.md").write_text("```sh\npython tools/a.py -c x.yml -o 'K=#1'\nls out\n```\n")
    commands = extract_commands(str(tmp_path))
    assert [(c.where, c.text) for c in commands] == [
        ("README.md:3", "python tools/a.py -c x.yml -o 'K=#1'"),
        ("docs/b.md:2", "python tools/a.py -c x.yml -o 'K=#1'"),
        ("docs/b.md:3", "ls out"),
    ]
    assert [c.where for c in unique_commands(commands)] == ["README.md:3", "docs/b.md:3"]
    with pytest.raises(AssertionError, match="docs/b.md:3: neither run nor listed in NOT_RUN: ls out"):
        classify(unique_commands(commands))


def tiny_overrides(text: str) -> List[str]:
    for config, overrides in TINY.items():
        if f"-c {config}" in text:
            return overrides
    return []


def run_command(
    copy: str, command: DocCommand, extra: List[str]
) -> Tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ)
    env.update(
        {
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": copy,  # the copy's ppdist, not an installed one
            "PATH": os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
            "MPLBACKEND": "Agg",
        }
    )
    text = with_overrides(command.text, tiny_overrides(command.text) + extra)
    start = time.perf_counter()
    result = subprocess.run(
        ["bash", "-c", text], cwd=copy, env=env, capture_output=True, text=True, timeout=HANG_TIMEOUT_S
    )
    return result, time.perf_counter() - start


@pytest.mark.slow
def test_docs_commands_run_in_order_in_a_fresh_copy(tmp_path):
    commands = unique_commands(extract_commands(REPO))
    chosen = classify(commands)
    copy = fresh_copy(REPO, str(tmp_path / "clone"))
    timings = []
    for command in commands:
        kind, index = chosen[command]
        if kind == "skip":
            continue
        _, expected, extra = RUN[index]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        result, seconds = run_command(copy, command, extra)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        timings.append(f"{seconds:6.1f} s wall {cpu:6.1f} s CPU  {command.where}")
        print(timings[-1], flush=True)
        assert result.returncode == 0, (
            f"{command.where}: exit {result.returncode}: {command.text}\n"
            f"STDOUT:\n{result.stdout[-3000:]}\nSTDERR:\n{result.stderr[-3000:]}"
        )
        missing = [p for p in expected if not glob.glob(os.path.join(copy, p))]
        assert not missing, f"{command.where}: {command.text}\ndid not write {missing}"
