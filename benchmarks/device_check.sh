#!/usr/bin/env bash
# Every paxlike check that needs an accelerator, in one run that fits 8 minutes on one H200,
# printed as one JSON object on stdout (progress on stderr).
#
#   benchmarks/device_check.sh [--python PATH] [--wheels DIR] [--budget SECONDS] [--quick]
#                              [--parts a,b,...]
#
# Parts, in order (each under a wall-clock limit; one that fails or runs out of time is recorded
# with its exit code and last stderr line, and the rest still run):
#   gpu_mfu          benchmarks/gpu_mfu.py: lm.Llama1B through the trainer vs the bare step,
#                    their MFU and ratio, and the FedAvg round row (125M LM, cohort 16, 4 steps)
#   federated_round  benchmarks/federated_round.py --cohorts 16: vmapped round vs per-client loop
#   weak_scaling     benchmarks/weak_scaling.py over the GPUs present
#   lever_*          the MFU levers, bare step of lm.Llama1B, each against gpu_mfu's bare step:
#                    remat none, batch 32, XLA's latency-hiding scheduler without Triton GEMMs,
#                    no donation (lever_remat_none, lever_batch_32, lever_xla_flags,
#                    lever_no_donation)
# --python PATH: the interpreter (default: python3 on PATH); it must import jax (0.11.x is fine)
#   and paxlike's dependencies. --wheels DIR first installs the wheels in DIR (--no-index
#   --no-deps, into a temporary --target) for an image that lacks fiddle, tfds, clu and friends.
# --quick: tiny shapes on any device (CPU here: the test suite's check of this script); each
#   part may then take up to 300 s (a loaded 2-core machine compiles slowly) within --budget.
# Data: lm.Llama1B reads this Python's standard library; Shakespeare comes from the data root
# ($PAXLIKE_DATA_DIR, else ../shared/data). Exit code 0 whenever the JSON was printed.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON_BIN="python3"
WHEELS=""
BUDGET=470
QUICK=0
PARTS="gpu_mfu,federated_round,weak_scaling,lever_remat_none,lever_batch_32,lever_xla_flags,lever_no_donation"
XLA_LEVER_FLAGS="--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_triton_gemm=false"

die() { echo "device_check: error: $*" >&2; exit 2; }
say() { echo "device_check: $*" >&2; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --python) [[ $# -ge 2 ]] || die "--python needs a path"; PYTHON_BIN="$2"; shift 2 ;;
    --wheels) [[ $# -ge 2 ]] || die "--wheels needs a directory"; WHEELS="$2"; shift 2 ;;
    --budget) [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || die "--budget needs seconds"; BUDGET="$2"; shift 2 ;;
    --parts) [[ $# -ge 2 ]] || die "--parts needs a list"; PARTS="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
command -v "$PYTHON_BIN" >/dev/null || die "no interpreter at $PYTHON_BIN"
for part in ${PARTS//,/ }; do
  [[ ",gpu_mfu,federated_round,weak_scaling,lever_remat_none,lever_batch_32,lever_xla_flags,lever_no_donation," == *",$part,"* ]] \
    || die "unknown part $part (see --help)"
done

OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
if [[ -n "$WHEELS" ]]; then
  say "installing the wheels in $WHEELS"
  "$PYTHON_BIN" -m pip install -q --no-index --no-deps --target "$OUT/site" "$WHEELS"/*.whl >&2
  export PYTHONPATH="$OUT/site${PYTHONPATH:+:$PYTHONPATH}"
fi
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
(( QUICK )) && Q=(--quick) || Q=()
START=$SECONDS

# run NAME LIMIT [ENV=VALUE ...] -- ARGS...: python ARGS under min(LIMIT, time left), its stdout
# (one JSON line) into $OUT/NAME.json, its exit code into $OUT/NAME.rc.
run() {
  local name="$1" limit="$2" left
  shift 2
  local envs=()
  while [[ "$1" != "--" ]]; do envs+=("$1"); shift; done
  shift
  [[ ",$PARTS," == *",$name,"* ]] || return 0
  (( QUICK )) && limit=300
  left=$(( BUDGET - (SECONDS - START) ))
  (( left < limit )) && limit=$left
  if (( limit < 20 )); then echo skipped > "$OUT/$name.rc"; say "$name: skipped (time)"; return 0; fi
  say "$name: up to ${limit}s"
  local began=$SECONDS rc=0
  env "${envs[@]}" timeout --signal=TERM --kill-after=10 "$limit" "$PYTHON_BIN" "$@" \
    > "$OUT/$name.json" 2> >(tee "$OUT/$name.err" >&2) || rc=$?
  echo "$rc" > "$OUT/$name.rc"
  echo $(( SECONDS - began )) > "$OUT/$name.s"
}

LEVER=(benchmarks/gpu_mfu.py --only=bare "${Q[@]}")
run gpu_mfu 210 -- benchmarks/gpu_mfu.py "${Q[@]}"
if (( QUICK )); then
  run federated_round 120 -- benchmarks/federated_round.py --quick --no-rss
  run weak_scaling 120 -- benchmarks/weak_scaling.py --quick --png "$OUT/weak_scaling.png"
else
  run federated_round 90 -- benchmarks/federated_round.py --cohorts 16 --no-rss --repeats 3
  run weak_scaling 60 -- benchmarks/weak_scaling.py --devices 1,2,4,8 --png /tmp/paxlike/weak_scaling.png
fi
run lever_remat_none 60 -- "${LEVER[@]}" --fdl_set=model.remat_policy=none
run lever_batch_32 60 -- "${LEVER[@]}" --fdl_set=data.batch_size=32
run lever_xla_flags 60 "XLA_FLAGS=${XLA_FLAGS:+$XLA_FLAGS }$XLA_LEVER_FLAGS" -- "${LEVER[@]}"
run lever_no_donation 60 -- "${LEVER[@]}" --no-donate

"$PYTHON_BIN" - "$OUT" "$PARTS" "$QUICK" "$((SECONDS - START))" "$XLA_LEVER_FLAGS" <<'EOF'
import json, pathlib, sys
out, parts, quick, total, xla_flags = pathlib.Path(sys.argv[1]), sys.argv[2].split(','), sys.argv[3], sys.argv[4], sys.argv[5]
result = {'benchmark': 'device_check', 'quick': quick == '1', 'total_s': int(total),
          'xla_lever_flags': xla_flags, 'parts': {}}
for name in parts:
  rc = (out / f'{name}.rc').read_text().strip()
  if rc == 'skipped':
    result['parts'][name] = {'skipped': 'time budget spent'}
    continue
  lines = (out / f'{name}.json').read_text().strip().splitlines()
  if rc == '0' and lines:
    part = json.loads(lines[-1])
  else:
    err = [l for l in (out / f'{name}.err').read_text().splitlines() if l.strip()]
    part = {'error': f'exit {rc}' + (' (time limit)' if rc in ('124', '137') else ''),
            'stderr_last_line': err[-1][-300:] if err else ''}
  part['wall_s'] = int((out / f'{name}.s').read_text())
  result['parts'][name] = part
def tokens_per_sec(part):
  lm = part.get('lm', {})
  return lm.get('bare_steps_per_sec') and lm['bare_steps_per_sec'] * lm['batch_size'] * lm['seq_len']
base = tokens_per_sec(result['parts'].get('gpu_mfu', {}))
for name, part in result['parts'].items():
  lever = tokens_per_sec(part) if name.startswith('lever_') else None
  if lever and base:
    part['tokens_per_sec_vs_gpu_mfu_bare'] = lever / base
print(json.dumps(result))
EOF
