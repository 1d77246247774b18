#!/usr/bin/env bash
# The GPU measurements that choose the compiled scripts' compile mode (docs/gpu.md, "What a GPU
# must measure next"), in order, each only while time is left (BUDGET_S, default 540 s of the at
# most 10 minutes a lent GPU's command may take):
#   1. airbench94_hiverge in each of the four modes, compiled in turn in a study's warmups (an
#      empty cache), then 10 timed runs of each, interleaved run by run;
#   2. airbench94_hiverge with and without the per-epoch evaluation, 10 runs each, interleaved: the
#      evaluation left out of the timed seconds must not hide host time;
#   3. the profile of one timed run, every kernel counted (tools/profile_run.py trace);
#   4. airbench96 and airbench96_faster beside the published scripts (gpu_bench.py).
# Run from the repository's root: bash tools/gpu_compile_session.sh. Each step's output, each line
# with the seconds since the step began, and its study go to $OUT/session.tgz; steps.txt beside it.
# It needs, in .gpu/ (outside git's view), data/cifar10-jpeg.tar.gz (the JPEG CIFAR-10 of
# docs/cpu.md), the maintainers' side-by-side harness tools/gpu_bench.py and the published scripts
# it runs (reference/, tools/reference.py says where they are published); without them step 4 and
# the data fail, and say so in steps.txt.
set -u
[ -x /opt/torch/.venv/bin/python ] && PATH=/opt/torch/.venv/bin:$PATH  # the lent GPUs' torch
OUT=${OUT:-/tmp/gpu-compile-session}
SESSION=$OUT/session
DATA=/tmp/cifar10-jpeg
deadline=$((SECONDS + ${BUDGET_S:-540}))
mkdir -p "$SESSION" "$DATA"
[ -d "$DATA/train" ] || tar xzf .gpu/data/cifar10-jpeg.tar.gz -C "$DATA"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$OUT/gpu.csv"
python -c 'import torch; print("torch", torch.__version__)' >> "$OUT/gpu.csv"

left() { echo $((deadline - SECONDS)); }
step() {  # step NAME SECONDS_IT_NEEDS COMMAND...: run it with the time left, or say it is skipped
    local name=$1 needs=$2
    shift 2
    if [ "$(left)" -lt "$needs" ]; then
        echo "skipped $name: $(left) s left, it needs about $needs" | tee -a "$OUT/steps.txt"
        return
    fi
    local start=$SECONDS
    local started
    started=$(date -u +%FT%T.%N)  # beside the records' finished times: the time to a first result
    timeout "$(left)" "$@" 2>&1 | while IFS= read -r line; do
        echo "$((SECONDS - start)) $line"
    done > "$SESSION/$name.log"
    echo "$name: exit ${PIPESTATUS[0]}, started $started, $((SECONDS - start)) s" |
        tee -a "$OUT/steps.txt"
}
pack() {  # every output in one file: a lent GPU's command returns at most 8 files
    tar czf "$OUT/session.tgz" -C "$OUT" session && rm -rf "$SESSION"
}
trap pack EXIT

MODES=(--config max-autotune
       --config no-cudagraphs net.compile_mode=max-autotune-no-cudagraphs
       --config reduce-overhead net.compile_mode=reduce-overhead
       --config default net.compile_mode=default)
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-modes
step modes 300 python study.py airbench94_hiverge --runs 10 --study-dir "$SESSION/modes" \
    "${MODES[@]}" -- --dataset folder --data-dir "$DATA"
step epoch-eval 60 python - "$DATA" <<'EOF'
"""airbench94_hiverge's runs with and without the per-epoch evaluation, alternating."""
import json, sys, time
import torch
sys.path.insert(0, '.')
import airbench94_hiverge as script
from studylib.data import load_study_data
device = torch.device('cuda', 0)
data = load_study_data('folder', sys.argv[1])
for split in ('train', 'test'):
    data[split] = {key: value.to(device) for key, value in data[split].items()}
net = script.build_net(script.hyp['net'], len(data['classes']), device, 'fp16')
script.train(data, script.hyp, device, 'fp16', 0, net)  # the warmup: every graph compiled
for run in range(10):
    for epoch_eval in (True, False):
        start = time.perf_counter()
        result = script.train(data, script.hyp, device, 'fp16', run, net, epoch_eval=epoch_eval)
        print(json.dumps(dict(run=run, epoch_eval=epoch_eval, accuracy=result['tta_val_acc'],
                              timed_seconds=result['total_time_seconds'],
                              wall_seconds=time.perf_counter() - start)))
EOF
step profile 60 python tools/profile_run.py trace airbench94_hiverge --data-dir "$DATA" \
    --out "$SESSION/profile" --chrome-trace
[ -f "$SESSION/profile/trace.json" ] && gzip -f "$SESSION/profile/trace.json"
unset TORCHINDUCTOR_CACHE_DIR  # gpu_bench.py keeps its own
step bench 120 env OUT="$SESSION/bench" BUDGET_S=$(($(left) - 10)) \
    python3 .gpu/tools/gpu_bench.py ours96:2 ref96:2 ours96faster:3 ref96faster:3
cat "$OUT/steps.txt"
