#!/usr/bin/env bash
# The GPU measurements that decide studylib/compiling.py and the compiled scripts' compile mode
# (docs/gpu.md, "Compiling on a GPU: what it must measure"), in order, each only while time is
# left (BUDGET_S, default 540 s of the at most 10 minutes a lent GPU's command may take):
#   1. a study of four airbench94_hiverge configurations whose graphs differ (every width scaled),
#      max-autotune, compiled all at once before the runs (--compile-jobs 4, an empty cache), then
#      3 timed runs of each: the time to its first record;
#   2. the unscaled configuration alone in an empty cache (its warmup compiles it, as each
#      configuration's does when they compile in turn), then 5 timed runs: the cold compile that
#      four configurations in turn would pay four times, and whether step 1's compiles at once on
#      one GPU cost its runs their kernel choices;
#   3. the four compile modes at once, then 10 timed runs of each, interleaved run by run;
#   4. airbench94_hiverge with and without the per-epoch evaluation, 10 runs each, interleaved: the
#      evaluation left out of the timed seconds must not hide host time;
#   5. the profile of one timed run, every kernel counted (tools/profile_run.py trace);
#   6. airbench96 and airbench96_faster beside the published scripts (gpu_bench.py).
# Run from the repository's root: bash tools/gpu_compile_session.sh. Each step's output, each line
# with the seconds since the step began, and its study go to $OUT/session.tgz; steps.txt beside it.
# It needs, in .gpu/ (outside git's view), data/cifar10-jpeg.tar.gz (the JPEG CIFAR-10 of
# docs/cpu.md), the maintainers' side-by-side harness tools/gpu_bench.py and the published scripts
# it runs (reference/, tools/reference.py says where they are published); without them step 6 and
# the data fail, and say so in steps.txt.
set -u
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
pack() {  # every output in one file: a command's files come back only a few at a time
    tar czf "$OUT/session.tgz" -C "$OUT" session
}
trap pack EXIT

width() {  # width SCALE: a --config of hiverge with every block's width times SCALE/8
    local scale=$1
    echo "net.widths={'block1': $((64 * scale / 8)), 'block2': $((256 * scale / 8)), 'block3': $((256 * scale / 8))}"
}
WIDTHS=(--config w8 "$(width 8)" --config w7 "$(width 7)" --config w6 "$(width 6)"
        --config w9 "$(width 9)")
step at-once 300 env TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-at-once \
    python study.py airbench94_hiverge --runs 3 --study-dir "$SESSION/at-once" --compile-jobs 4 \
    "${WIDTHS[@]}" -- --dataset folder --data-dir "$DATA"
step alone 120 env TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-alone \
    python study.py airbench94_hiverge --runs 5 --study-dir "$SESSION/alone" \
    --config w8 "$(width 8)" -- --dataset folder --data-dir "$DATA"
MODES=(--config max-autotune
       --config no-cudagraphs net.compile_mode=max-autotune-no-cudagraphs
       --config reduce-overhead net.compile_mode=reduce-overhead
       --config default net.compile_mode=default)
step modes 300 env TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-modes \
    python study.py airbench94_hiverge --runs 10 --study-dir "$SESSION/modes" --compile-jobs 4 \
    "${MODES[@]}" -- --dataset folder --data-dir "$DATA"
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
step profile 60 python tools/profile_run.py trace airbench94_hiverge --data-dir "$DATA" \
    --out "$SESSION/profile" --chrome-trace
[ -f "$SESSION/profile/trace.json" ] && gzip -f "$SESSION/profile/trace.json"
unset TORCHINDUCTOR_CACHE_DIR  # gpu_bench.py keeps its own
step bench 120 env OUT="$SESSION/bench" BUDGET_S=$(($(left) - 10)) \
    python3 .gpu/tools/gpu_bench.py ours96:2 ref96:2 ours96faster:3 ref96faster:3
cat "$OUT/steps.txt"
