#!/usr/bin/env bash
# The peer comparisons on one GPU, in one run that fits 9 minutes: paxlike's decode against
# transformers' `generate` (whole runs and in-process), and paxlike's trainer against MaxText
# 0.2.5's on the small and the large model of maxtext_step.py, each part under its own limit.
#
#   benchmarks/peers/gpu_peers.sh OUT_DIR [WHEELS_DIR]
#
# The interpreter is python3 (an image with jax, torch and transformers); WHEELS_DIR, when
# given, holds the wheels it lacks (paxlike's dependencies, MaxText and its own), installed
# with --no-index --no-deps into a temporary --target first. Tiny Shakespeare comes from
# tests/fixtures/data. Each part writes OUT_DIR/PART.json (stdout) and OUT_DIR/PART.err; a part
# that fails or runs out of time leaves its exit code in OUT_DIR/PART.rc and the rest still run.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:?usage: gpu_peers.sh OUT_DIR [WHEELS_DIR]}"
WHEELS="${2:-}"
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
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.json" 2>"$OUT/$name.err"
  echo $? >"$OUT/$name.rc"
  echo "gpu_peers: $name exit $(cat "$OUT/$name.rc") after $((SECONDS - start)) s" >&2
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import jax, torch, transformers; print(jax.__version__, jax.devices(),
torch.__version__, torch.cuda.is_available(), transformers.__version__)'
  git -C "$REPO" log -1 --format=%H 2>/dev/null; } >"$OUT/machine.txt" 2>&1
part decode 200 python3 benchmarks/peers/transformers_decode.py --device cuda \
  --peer_python python3 --pax_python python3 --repeats 2 --work /tmp/gpu_peers_decode
for model in small large; do
  part "maxtext_$model" 150 python3 benchmarks/peers/maxtext_step.py --hardware gpu \
    --meshes 1dev --model "$model" --pairs 2 --steps 20 --peer_python python3 \
    --pax_python python3 --work "/tmp/gpu_peers_mt_$model"
done
