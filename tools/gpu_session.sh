#!/bin/bash
# The next GPU session in one command (docs/benchmarks.md, "Next GPU session"), from the repository root:
#   OUT=$OUT bash tools/gpu_session.sh                 # steps, trainer, suite: at most ~9.6 minutes
#   OUT=$OUT SUITE_S=480 bash tools/gpu_session.sh suite   # a second call: the CUDA suite alone
# Parts, in order, each under its own time cap (seconds, overridable) so a slow one cannot eat the others:
#   steps   (STEPS_S per recipe): tools/benchmark.py --step_time, the bare Trainer.step of each of the 8
#           recipes at its real input and per-GPU batch in fp32 and bf16, the 6 static ones also captured
#           (Global.cuda_graph: bf16_graph; OCRNet and SLANet also fp32_graph) (median ms/step, samples/s, issue
#           time, kernels/step, GPU-busy share, top kernels); PP-YOLOE-s also --size_costs 6 (cuDNN
#           autotuning on vs off: what decides Global.cudnn_warmup / cudnn_benchmark)
#   trainer (TRAINER_S per run): tools/benchmark.py --synthetic: trainer against the bare loop (median steps,
#           epoch ends left out; loader workers from the cores) for PP-YOLOE-s bf16 and PP-LiteSeg-T bf16
#   suite   (SUITE_S): python -m pytest tests/cuda -m cuda
# Everything streams to stdout and lands in $OUT (JSON per measurement, logs).
set -u
OUT=${OUT:-output/gpu_session}; mkdir -p "$OUT"
PARTS=${*:-steps trainer suite}
STEPS_S=${STEPS_S:-35}; TRAINER_S=${TRAINER_S:-55}; SUITE_S=${SUITE_S:-45}
T0=$(date +%s); el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
el "env"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/env.txt"
nproc | tee -a "$OUT/env.txt"
LITESEG=configs/seg/pp_liteseg_stdc1_cityscapes_1024x512_scale0.5_160k.yml
PPYOLOE=configs/det/ppyoloe_crn_s_300e_coco.yml
# the seed's Faster R-CNN R50-vd FPN 1x: PaddleDetection release/2.7.1's file, as the tests hold it
FASTER_RCNN=tests/fixtures/paddle_configs/PaddleDetection/configs/faster_rcnn/faster_rcnn_r50_vd_fpn_1x_coco.yml
BF16="Global.use_amp=true Global.amp_dtype=bfloat16"

if [[ " $PARTS " == *" trainer "* ]]; then  # the trainer part's synthetic sets, drawn on the CPU meanwhile
    nice -n 19 python - > "$OUT/draw.log" 2>&1 <<'EOF' &
import os, sys
sys.path.insert(0, os.getcwd())
from ppdist.benchmark.pipeline_data import with_synthetic_data
from ppdist.convert.configs import load_config
for path, images in [("configs/det/ppyoloe_crn_s_300e_coco.yml", 256),
                     ("configs/seg/pp_liteseg_stdc1_cityscapes_1024x512_scale0.5_160k.yml", 64)]:
    with_synthetic_data(load_config(path, []), os.path.abspath("output/benchmark/synthetic"), images)
    print("drawn", path, flush=True)
EOF
    DRAW=$!
fi

step() {  # name, config, H, W, limit, precisions, extra args...
    local name=$1 cfg=$2 h=$3 w=$4 limit=$5 precisions=$6; shift 6
    el "step $name"
    # shellcheck disable=SC2086  # the precisions are words
    timeout "$limit" python tools/benchmark.py -c "$cfg" --step_time --step_size "$h" "$w" \
        --precisions $precisions --warmup 3 --iters 10 --json "$OUT/step_$name.json" "$@" \
        2> "$OUT/step_$name.err" | grep -E "^(step|size)" || tail -3 "$OUT/step_$name.err"
}
# the static recipes also as the captured step (Global.cuda_graph: a CUDA graph replayed per step):
# both precisions for the launch-bound OCRNet and SLANet, bf16 for the others
GRAPHS="fp32 bf16 fp32_graph bf16_graph"; GRAPH_BF16="fp32 bf16 bf16_graph"
if [[ " $PARTS " == *" steps "* ]]; then
    step pp_liteseg "$LITESEG" 512 1024 $((STEPS_S + 10)) "$GRAPH_BF16"
    step ocrnet configs/seg/ocrnet_hrnetw18_cityscapes_1024x512_160k.yml 512 1024 $((STEPS_S + 15)) "$GRAPHS"
    step slanet configs/table/SLANet.yml 488 488 $((STEPS_S + 35)) "$GRAPHS" --profile_steps 1 -o "Global.amp_custom_white_list=[]"
    step ppyoloe "$PPYOLOE" 640 640 $((STEPS_S + 60)) "fp32 bf16" --size_costs 6
    step segformer configs/seg/segformer_b0_cityscapes_1024x1024_160k.yml 1024 1024 $((STEPS_S + 10)) "$GRAPH_BF16"
    step crnn configs/rec/rec_mv3_none_bilstm_ctc.yml 32 100 $((STEPS_S + 10)) "$GRAPH_BF16"
    step ppocrv3 configs/rec/PP-OCRv3/ch_PP-OCRv3_rec_distillation.yml 48 320 $((STEPS_S + 10)) "$GRAPH_BF16"
    step faster_rcnn "$FASTER_RCNN" 800 1216 "$STEPS_S" "fp32 bf16" --step_batch 2
fi

trainer() {  # name, config, images, overrides...
    local name=$1 cfg=$2 n=$3; shift 3
    el "trainer $name"
    timeout "$TRAINER_S" python tools/benchmark.py -c "$cfg" --synthetic --images "$n" --warmup 10 --iters 30 \
        --skip eval infer scaling --json "$OUT/trainer_$name.json" -o "$@" > "$OUT/trainer_$name.log" 2>&1
    grep -E "^  (trainer|bare loop|trainer/bare|input pipeline|warm-up|environment)" "$OUT/trainer_$name.log" \
        || tail -3 "$OUT/trainer_$name.log"
}
if [[ " $PARTS " == *" trainer "* ]]; then
    wait "$DRAW"; tail -2 "$OUT/draw.log"
    trainer ppyoloe_bf16 "$PPYOLOE" 256 $BF16
    trainer pp_liteseg_bf16 "$LITESEG" 64 $BF16
fi

if [[ " $PARTS " == *" suite "* ]]; then
    el "CUDA suite (${SUITE_S} s)"
    timeout "$SUITE_S" python -m pytest tests/cuda -m cuda -q -n 8 -p no:cacheprovider > "$OUT/cuda_suite.log" 2>&1
    grep -E "passed|failed|FAILED|ERROR" "$OUT/cuda_suite.log" | tail -25
fi
el "done"
