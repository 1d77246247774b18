#!/usr/bin/env bash
# The GPU measurements that choose the compiled scripts' compile mode (docs/gpu.md, "Compile
# modes: what a GPU must measure"), in order, each only while time is left (BUDGET_S, default 530 s
# of the at most 9 minutes a lent GPU's command may take):
#   1. airbench94_hiverge's cold compile in each of the four modes, all at once (study.py
#      compiles them before its runs: upper bounds, as they share the cores and the GPU), then 10
#      timed runs of each mode, interleaved run by run;
#   2. max-autotune compiled alone into an empty cache (its cold compile alone and the time to its
#      first result), then 10 timed runs: against step 1's, whether compiles at once on one GPU
#      cost the runs their kernel choices;
#   3. airbench94_hiverge with and without the per-epoch evaluation, 10 runs each, interleaved: the
#      evaluation left out of the timed seconds must not hide host time;
#   4. the profile of one timed run, every kernel counted (tools/profile_run.py trace);
#   5. airbench96 and airbench96_faster beside the published scripts (gpu_bench.py).
# Run from the repository's root: bash tools/gpu_compile_session.sh; every output goes under $OUT.
# It needs, in .gpu/ (outside git's view), data/cifar10-jpeg.tar.gz (the JPEG CIFAR-10 of
# docs/cpu.md), the maintainers' side-by-side harness tools/gpu_bench.py and the published scripts
# it runs (reference/, tools/reference.py says where they are published); without them step 5 and
# the data fail, and say so in steps.txt.
set -u
OUT=${OUT:-/tmp/gpu-compile-session}
DATA=/tmp/cifar10-jpeg
deadline=$((SECONDS + ${BUDGET_S:-530}))
mkdir -p "$OUT" "$DATA"
[ -d "$DATA/train" ] || tar xzf .gpu/data/cifar10-jpeg.tar.gz -C "$DATA"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$OUT/gpu.csv"

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
    timeout "$(left)" "$@" > "$OUT/$name.log" 2>&1
    echo "$name: exit $?, started $started, $((SECONDS - start)) s" | tee -a "$OUT/steps.txt"
}

MODES=(--config max-autotune
       --config no-cudagraphs net.compile_mode=max-autotune-no-cudagraphs
       --config reduce-overhead net.compile_mode=reduce-overhead
       --config default net.compile_mode=default)
step modes 300 env TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-modes \
    python study.py airbench94_hiverge --runs 10 --study-dir "$OUT/modes" --compile-jobs 4 \
    "${MODES[@]}" -- --dataset folder --data-dir "$DATA"
step alone 150 env TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-alone \
    python study.py airbench94_hiverge --runs 10 --study-dir "$OUT/alone" \
    --config max-autotune -- --dataset folder --data-dir "$DATA"
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-alone
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
step profile 60 python tools/profile_run.py trace airbench94_hiverge --out "$OUT/profile" \
    --chrome-trace
[ -f "$OUT/profile/trace.json" ] && gzip -f "$OUT/profile/trace.json"
unset TORCHINDUCTOR_CACHE_DIR  # gpu_bench.py keeps its own
step bench 120 env OUT="$OUT/bench" BUDGET_S=$(($(left) - 10)) \
    python3 .gpu/tools/gpu_bench.py ours96:2 ref96:2 ours96faster:3 ref96faster:3
cat "$OUT/steps.txt"
