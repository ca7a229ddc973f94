#!/usr/bin/env bash
# Run ON a lent GPU machine, in the same call as and after .gpu-debs/build-on-gpu.sh (which built
# build-gpu/ with -DMW_CUDA=ON and unpacked the libraries into /tmp/gpu-deps):
#   bash .gpu-debs/build-on-gpu.sh -R 'Cuda|Cublas|CUDA|Gpu|Nccl'; bash tools/gpu_bench.sh
# 1. GPT-2 training steps, memwall (gpt2_train --device cuda) against the machine's own PyTorch
#    (tools/torch_gpt2_bench.py --device cuda: fp32, TF32 off), same shapes, dropout 0, run side by
#    side; medians of the steps after the first.
#    Then gpt2_bench --device cuda on GPT-2 small B8 T1024 (the same comparison with device peaks and
#    the GEMM ceiling), and again with CUDA_LAUNCH_BLOCKING=1 for its per-op table in GPU time.
# 2. The paths the tests do not reach on a GPU, each run once on GPT-2 small: bf16, recomputation,
#    Gemini auto and static (parameters and states on the host), HF save then --init-from.
# Everything goes to $OUT/bench.log; the last lines printed are a summary table.
# `bash tools/gpu_bench.sh quick`: only the comparison of GPT-2 small B8 T1024 and medium B4 T1024.
# `bash tools/gpu_bench.sh nccl`: the NCCL tests (one GPU runs the one-rank ones), then GPT-2 small
# B8 T1024 on one NCCL rank at ZeRO 0-3 and under Gemini against the plain run: steps and losses.
# `bash tools/gpu_bench.sh bf16`: small B8 T1024 in fp32, then small and medium with autocast bf16
# on both sides.
# `bash tools/gpu_bench.sh tiers`: GPT-2 medium B2 T128 with Gemini's three tiers on the GPU capped to
# 768 MiB (`--device cuda:768MiB`) against `--offload nvme --fraction 1.0`: peak RSS, step, losses.
# `bash tools/gpu_bench.sh accum`: GPT-2 small B8 T1024 --grad-accum 2 under Gemini auto and static
# (host states), chunks updated in the last micro-batch's backward against all at the step.
# `bash tools/gpu_bench.sh copystream`: GPT-2 medium B2 T128 on a GPU capped to 768 MiB under Gemini
# auto, --copy-worker off against on (Note [Copy worker]: chunks copied ahead on a copy stream).
# `bash tools/gpu_bench.sh copies`: the same model and GPU in bf16, --chunk-copy-dtype fp32 against
# auto (Note [16-bit copies]: the blocks' matrices copied to the device in bf16).
# `bash tools/gpu_bench.sh paths`: GPT-2 small B8 T1024, 6 steps each, plain against Gemini auto
# (with --gpu-margin-mem-ratio 0, 0.5, 1), fp16 and bf16, gradient accumulation (plain and Gemini
# static on the host), activation offload, Gemini static with host states (parameters on the GPU, then
# on the host with NVMe states), Gemini's three tiers (states and a chunk on disk): step,
# device peak against the --plan, loss.
set -uo pipefail
out=${OUT:-/tmp/out}; log=$out/bench.log
runs=/tmp/gpu-bench; mkdir -p "$out" "$runs"  # one file per run here ($OUT brings back 8 files at most)
lib=/tmp/gpu-deps/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread:${LD_LIBRARY_PATH:-}
train=build-gpu/apps/gpt2_train
[[ -x $train ]] || { echo "no $train: run .gpu-debs/build-on-gpu.sh first"; exit 2; }
summary=()

# run NAME SECONDS CMD...: appends the command and its output to the log; prints nothing.
run() {
  local name=$1 limit=$2; shift 2
  echo "== $name: $*" >>"$log"
  timeout "$limit" "$@" >"$runs/$name.txt" 2>&1
  local rc=$?
  cat "$runs/$name.txt" >>"$log"; echo "rc=$rc" >>"$log"
  return $rc
}

# "median ms / device peak MiB / first loss" from a torch_gpt2_bench.py --json output file.
torch_figures() {
  python3 -c 'import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("%.1f ms / %.0f MiB / loss0 %.4f" % (j["median_step_ms"], j["device_peak_mb"], j["losses"][0]))' \
    "$1" 2>/dev/null || echo "failed"
}

# One shape in one precision (fp32 unless a fifth argument says bf16): PyTorch with HF's eager
# attention, PyTorch with its fused SDPA, then memwall.
compare() {
  local model=$1 batch=$2 seq=$3 steps=$4 precision=${5:-fp32} a
  local tag="$1-b$2-t$3${5:+-$5}"
  for a in eager sdpa; do
    run "torch-$a-$tag" 150 python3 tools/torch_gpt2_bench.py --device cuda --model "$model" \
      --batch "$batch" --seq "$seq" --steps "$steps" --attention "$a" --precision "$precision" --json
  done
  run "mw-$tag" 150 "$train" --device cuda --model "$model" --batch "$batch" --seq "$seq" \
    --steps "$steps" --dropout 0 --precision "$precision" --log "$runs/mw-$tag.jsonl"
  local m mp
  # the median of the steps after the first, as torch_gpt2_bench.py's (gpt2_train's own counts all)
  m=$(python3 -c 'import json, statistics, sys
s = [json.loads(l)["step_ms"] for l in open(sys.argv[1]) if l.strip()]
print("%.1f" % statistics.median(s[1:]))' "$runs/mw-$tag.jsonl" 2>/dev/null)
  mp=$(grep -o 'cuda:0 peak [0-9]* MiB' "$runs/mw-$tag.txt" | tail -1)
  summary+=("$tag  torch eager $(torch_figures "$runs/torch-eager-$tag.txt") | torch sdpa \
$(torch_figures "$runs/torch-sdpa-$tag.txt") | memwall ${m:-?} ms ${mp:-?} loss0 \
$(grep -o '^\[0\] loss: [0-9.]*' "$runs/mw-$tag.txt" | grep -o '[0-9.]*$')")
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader >>"$log"
if [[ ${1:-} == quick ]]; then  # the fp32 comparison alone, for a short lease
  compare small 8 1024 8
  compare medium 4 1024 6
  printf '%s\n' "${summary[@]}"
  exit 0
fi
if [[ ${1:-} == paths ]]; then  # the CUDA paths written without a GPU (sessions 16-19), run once each
  small=(--device cuda --model small --batch 8 --seq 1024 --dropout 0)
  for v in "plain:" "auto:--gemini auto" "auto-margin1:--gemini auto --gpu-margin-mem-ratio 1" \
           "auto-margin05:--gemini auto --gpu-margin-mem-ratio 0.5" \
           "fp16:--precision fp16" "bf16:--precision bf16" \
           "accum2:--grad-accum 2 --grad-clip 1" \
           "static-host-accum2:--gemini static --offload-param-frac 1 --offload-optim-frac 1 --grad-accum 2 --grad-clip 1" \
           "offload-act:--checkpoint-activations --offload-activations" \
           "static-optim-host:--gemini static --offload-optim-frac 1" \
           "gemini-nvme:--gemini static --offload-param-frac 1 --offload-optim-frac 1 --offload nvme" \
           "three-tiers:--gemini static --offload-param-frac 1 --offload-optim-frac 1 \
--host-capacity 800MiB"; do
    name=${v%%:*}; read -r -a extra <<<"${v#*:}"
    run "plan-$name" 60 "$train" "${small[@]}" --steps 6 "${extra[@]}" --plan
    run "mw-$name" 150 "$train" "${small[@]}" --steps 6 "${extra[@]}"
    summary+=("$name rc=$? $(grep -o 'median step: [0-9.]* ms' "$runs/mw-$name.txt") \
$(grep -o 'cuda:0 peak [0-9]* MiB' "$runs/mw-$name.txt" | tail -1) (plan $(grep -o 'cuda:0 *[0-9.]* MiB' \
"$runs/plan-$name.txt" | tail -1)) $(grep -o '\[5\] loss: [0-9.]*' "$runs/mw-$name.txt") \
$(grep -o '^Gemini: [0-9.]* MiB host->device.*evictions' "$runs/mw-$name.txt")")
  done
  printf '%s\n' "${summary[@]}"
  exit 0
fi
if [[ ${1:-} == accum ]]; then  # Note [Updates in the last backward] on a GPU: the CPU Adam of
  # host-state chunks overlapped with the last micro-batch's backward, against every update at the
  # step (--update-in-backward off); alternated, twice each
  small=(--device cuda --model small --batch 8 --seq 1024 --dropout 0 --steps 6 --grad-accum 2)
  for v in "auto:--gemini auto" \
           "static-host:--gemini static --offload-param-frac 1 --offload-optim-frac 1"; do
    name=${v%%:*}; read -r -a extra <<<"${v#*:}"
    for i in 1 2; do
      run "last-$name-$i" 150 "$train" "${small[@]}" "${extra[@]}"
      run "off-$name-$i" 150 "$train" "${small[@]}" "${extra[@]}" --update-in-backward off
      for m in last off; do
        summary+=("$m-$name-$i $(grep -o 'median step: [0-9.]* ms' "$runs/$m-$name-$i.txt") \
$(grep -o '\[5\] loss: [0-9.]*' "$runs/$m-$name-$i.txt") \
$(grep -o '[0-9.]* of [0-9]* chunks per step updated' "$runs/$m-$name-$i.txt")")
      done
    done
  done
  printf '%s\n' "${summary[@]}"
  exit 0
fi
if [[ ${1:-} == copystream || ${1:-} == copies ]]; then  # a model larger than the capped device
  # (every step gathers its chunks). copystream (Note [Copy worker]): chunks copied ahead on the
  # copy stream against gathers on the compute stream. copies (Note [16-bit copies]): in bf16, the
  # blocks' matrices copied in f32 against bf16. Alternated, three times each (steps of one run
  # varied by 15% on session 34's H200); the losses must be equal.
  medium=(--model medium --batch 2 --seq 128 --steps 8 --dropout 0 --device cuda:768MiB \
    --gemini auto --checkpoint-activations)
  if [[ $1 == copystream ]]; then flag=--copy-worker; values=(off on)
  else flag=--chunk-copy-dtype; values=(fp32 auto); medium+=(--precision bf16); fi
  for i in 1 2 3; do
    for w in "${values[@]}"; do
      run "copy-$w-$i" 300 "$train" "${medium[@]}" "$flag" "$w"
      summary+=("copy-$w-$i rc=$? $(grep -o 'median step: [0-9.]* ms' "$runs/copy-$w-$i.txt") \
$(grep -o 'cuda:0 peak [0-9]* MiB' "$runs/copy-$w-$i.txt" | tail -1) \
$(grep -o '^\[[0-9]\] loss: [0-9.]*' "$runs/copy-$w-$i.txt" | grep -o '[0-9.]*$' | tr '\n' ' ') \
$(grep -o '^Gemini: [0-9.]* MiB host->device.*evictions' "$runs/copy-$w-$i.txt")")
    done
  done
  printf '%s\n' "${summary[@]}"
  exit 0
fi
if [[ ${1:-} == tiers ]]; then  # issue #10's three tiers on a GPU capped to 768 MiB, against NVMe
  medium=(--model medium --batch 2 --seq 128 --steps 3 --dropout 0)
  run tiers 300 "$train" "${medium[@]}" --device cuda:768MiB --gemini auto --host-capacity 1GiB \
    --checkpoint-activations
  run nvme 300 "$train" "${medium[@]}" --offload nvme --fraction 1.0
  for name in tiers nvme; do
    echo "$name: $(grep -o 'Peak RSS: [0-9]* MiB | median step: [0-9.]* ms' "$runs/$name.txt") \
$(grep -o 'cuda:0 peak [0-9]* MiB' "$runs/$name.txt" | tail -1) losses \
$(grep -o '^\[[0-9]\] loss: [0-9.]*' "$runs/$name.txt" | grep -o '[0-9.]*$' | tr '\n' ' ')"
  done
  exit 0
fi
if [[ ${1:-} == nccl ]]; then  # data parallel over NCCL (session 35, written without a GPU): the
  # tests first, then GPT-2 small on one NCCL rank at each stage and under Gemini against the plain
  # run (same losses within the data-parallel tolerance; the step's cost of the collectives)
  run nccl-tests 400 ctest --test-dir build-gpu -j2 -R 'Nccl|BucketsDevice|StagedCollectives'
  summary+=("nccl tests: $(grep -E 'tests passed|Failed|Skipped' "$runs/nccl-tests.txt" | tr '\n' ' ')")
  small=(--device cuda --model small --batch 8 --seq 1024 --steps 6 --dropout 0)
  run plain 150 "$train" "${small[@]}"
  summary+=("plain $(grep -o 'median step: [0-9.]* ms' "$runs/plain.txt") \
$(grep -o '^\[[0-9]\] loss: [0-9.]*' "$runs/plain.txt" | grep -o '[0-9.]*$' | tr '\n' ' ')")
  for v in "z0:--zero 0" "z1:--zero 1" "z2:--zero 2" "z3:--zero 3" "gemini-auto-z0:--gemini auto" \
           "gemini-host-z2:--gemini static --offload-param-frac 1 --offload-optim-frac 1 --zero 2"; do
    name=${v%%:*}; read -r -a extra <<<"${v#*:}"
    run "nccl-$name" 200 mpirun --allow-run-as-root -np 1 "$train" "${small[@]}" --dist nccl \
      "${extra[@]}"
    summary+=("nccl-$name rc=$? $(grep -o 'median step: [0-9.]* ms' "$runs/nccl-$name.txt") \
$(grep -o 'cuda:0 peak [0-9]* MiB' "$runs/nccl-$name.txt" | tail -1) \
$(grep -o '^\[[0-9]\] loss: [0-9.]*' "$runs/nccl-$name.txt" | grep -o '[0-9.]*$' | tr '\n' ' ')")
  done
  printf '%s\n' "${summary[@]}"
  exit 0
fi
if [[ ${1:-} == bf16 ]]; then  # autocast bf16 against torch.autocast, with fp32 small as the anchor
  compare small 8 1024 8
  compare small 8 1024 8 bf16
  compare medium 4 1024 6 bf16
  printf '%s\n' "${summary[@]}"
  exit 0
fi
compare small 4 128 10
compare small 8 1024 8
compare medium 4 1024 6
bench=build-gpu/apps/gpt2_bench
# one round each (Note [Alternated rounds]): a lent GPU is not shared, and the lease is short
run bench-small 200 "$bench" --device cuda --model small --batch 8 --seq 1024 --steps 6 --threads 16 \
  --rounds 1
run bench-small-blocking 200 env CUDA_LAUNCH_BLOCKING=1 "$bench" --device cuda --model small \
  --batch 8 --seq 1024 --steps 4 --threads 16 --torch off --rounds 1

small=(--device cuda --model small --batch 8 --seq 1024 --steps 4)
for v in "bf16:--precision bf16" "recompute:--checkpoint-activations" \
         "gemini-auto:--gemini auto" \
         "gemini-static-host:--gemini static --offload-param-frac 1 --offload-optim-frac 1"; do
  name=${v%%:*}; read -r -a extra <<<"${v#*:}"
  run "mw-$name" 150 "$train" "${small[@]}" "${extra[@]}"
  summary+=("$name rc=$? $(grep -o 'median step: [0-9.]* ms' "$runs/mw-$name.txt") $(grep -o '\[3\] loss: [0-9.]*' "$runs/mw-$name.txt")")
done
run mw-save 120 "$train" --device cuda --model small --batch 2 --seq 64 --steps 2 --save /tmp/gpu-save &&
  run mw-init-from 120 "$train" --device cuda --init-from /tmp/gpu-save --batch 2 --seq 64 --steps 1
summary+=("save+init-from rc=$?")

compare large 4 1024 5  # last: the longest, and the one to lose if the lease runs short

echo "---- gpt2_bench --device cuda (full output in $log)"
sed -n '/memwall *PyTorch/,/^achieved/p' "$runs/bench-small.txt" | grep -v "^  [A-Za-z]"
echo "-- with CUDA_LAUNCH_BLOCKING=1:"
sed -n '/^phases/,/^achieved/p' "$runs/bench-small-blocking.txt"
echo "---- summary"
grep -h "loss" "$runs"/mw-small-b8-t1024.txt | head -3
printf '%s\n' "${summary[@]}"
