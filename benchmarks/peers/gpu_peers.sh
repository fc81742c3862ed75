#!/usr/bin/env bash
# The peer comparisons on one GPU, in one run that fits 9 minutes: paxlike's decode against
# transformers' `generate` timed in-process, and paxlike's trainer against MaxText 0.2.5's on
# the small and the large model of maxtext_step.py, each part under its own limit.
#
#   benchmarks/peers/gpu_peers.sh OUT_DIR [WHEELS_DIR] [PARTS]
#
# PARTS (comma-separated; default decode,maxtext_small,maxtext_large): `decode_whole_runs`
# adds the whole-process decode comparison, which needs about 5 more minutes on an H200 image
# (each process imports torch or jax and starts CUDA), so it does not fit beside the others.
#
# The interpreter is python3 (an image with jax, torch and transformers); WHEELS_DIR, when
# given, holds the wheels it lacks (paxlike's dependencies, MaxText and its own), installed
# with --no-index --no-deps into a temporary --target first. Tiny Shakespeare comes from
# tests/fixtures/data. Each part writes OUT_DIR/PART.json (stdout) and OUT_DIR/PART.err, and its
# exit code and seconds in OUT_DIR/parts.log (124: out of time); the rest still run. At most 8
# files, as the device tool brings back.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:?usage: gpu_peers.sh OUT_DIR [WHEELS_DIR]}"
WHEELS="${2:-}"
PARTS=",${3:-decode,maxtext_small,maxtext_large},"
mkdir -p "$OUT"
cd "$REPO"
if [[ -n "$WHEELS" ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu_peers_site \
    "$WHEELS"/*.whl || exit 2
  export PYTHONPATH="/tmp/gpu_peers_site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PAXLIKE_DATA_DIR="$REPO/tests/fixtures/data" PYTHONUNBUFFERED=1

part() {  # part NAME SECONDS COMMAND...
  local name="$1" limit="$2"; shift 2
  [[ "$PARTS" == *",$name,"* ]] || return 0
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.json" 2>"$OUT/$name.err"
  echo "$name exit $? after $((SECONDS - start)) s" | tee -a "$OUT/parts.log" >&2
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import jax, torch, transformers; print(jax.__version__, jax.devices(),
torch.__version__, torch.cuda.is_available(), transformers.__version__)'
  git -C "$REPO" log -1 --format=%H 2>/dev/null; } >"$OUT/machine.txt" 2>&1
DECODE=(python3 benchmarks/peers/transformers_decode.py --device cuda --peer_python python3
        --pax_python python3 --work /tmp/gpu_peers_decode)
part decode 150 "${DECODE[@]}" --repeats 3 --parts in_process
part maxtext_small 150 python3 benchmarks/peers/maxtext_step.py --hardware gpu --meshes 1dev \
  --model small --pairs 2 --steps 20 --peer_python python3 --pax_python python3 \
  --work /tmp/gpu_peers_mt_small
part maxtext_large 240 python3 benchmarks/peers/maxtext_step.py --hardware gpu --meshes 1dev \
  --model large --pairs 2 --steps 20 --peer_python python3 --pax_python python3 \
  --work /tmp/gpu_peers_mt_large
part decode_whole_runs 420 "${DECODE[@]}" --repeats 1 --parts whole_runs
