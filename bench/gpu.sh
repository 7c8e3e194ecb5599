#!/usr/bin/env bash
# Issue 18's device check, prepared as one script for a lent GPU (the `device` tool runs it in the repo root;
# python3 there holds a CUDA PyTorch, so the package is used from src/ without installing). Sized to end within
# ~9 minutes; each step has its own limit so one slow step cannot eat the rest. Results land in $OUT (or
# bench/results when run by hand): the GPU tests' log, and the kernels / attention / long / decode suites on CUDA
# in bf16 as JSON + printed tables.
#
#   device run:  bash bench/gpu.sh        (timeout_s 600)
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
py=python3
$py -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" || exit 1
step() {  # step SECONDS NAME COMMAND...: run with a limit, keep going either way, log the exit status
    local limit=$1 name=$2; shift 2
    echo "=== $name (limit ${limit}s)"
    timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log" | grep -v "it/s]" | tail -40
    echo "=== $name: exit ${PIPESTATUS[0]}"
}
# the numbers first (the kernel targets): kernels at 16k and 64k (auto == flex on CUDA, so not timed twice)
step 200 kernels $py -m multihead.cli bench kernels --device cuda --dtype bf16 --lengths 16384,65536 \
    --impls sdpa,torch_flex,window,flex,memory_efficient --min-time 0.3 --out "$OUT/kernels-cuda-bf16.json"
step 120 attention $py -m multihead.cli bench attention --device cuda --dtype bf16 \
    --impls torch_mha,multihead,multihead[memory_efficient] --min-time 0.3 --out "$OUT/attention-cuda-bf16.json"
# every test marked gpu (each FlexAttention mask compiles once: the slowest step)
step 150 gpu-tests $py -m pytest -q -m gpu -p no:cacheprovider -x tests/attention/test_gpu_matrix.py \
    tests/attention/test_gpu.py tests/robustness/test_gpu_reliability.py
step 60 decode $py -m multihead.cli bench decode --device cuda --dtype bf16 --lengths 256 --batches 1,16 \
    --impls cached,hf_generate --out "$OUT/decode-cuda-bf16.json"
