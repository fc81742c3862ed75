#!/usr/bin/env bash
# Every paxlike check that needs an accelerator, in one run (about 15 minutes on one TPU v5e
# chip: where a command is cut at 10, run the parts in two calls, as docs/benchmarks.md shows),
# printed as one JSON object on stdout (progress on stderr).
#
#   benchmarks/device_check.sh [--wheels DIR] [--python PATH] [--budget SECONDS] [--quick]
#                              [--parts a,b,...]
#
# On a TPU machine with nothing else installed (Python 3.11, JAX + libtpu preinstalled, its own
# package index at file:///opt/pypi/simple): `benchmarks/device_check.sh --wheels DIR`, where DIR
# holds the wheels the index lacks (`make tpu-wheels`, tpu-wheels.txt). The install goes into a
# --target folder (default /tmp/paxlike-tpu-site, reused on the next run; PAXLIKE_TPU_SITE) that
# is appended to PYTHONPATH, and any JAX, jaxlib, libtpu or numpy pip put there is removed, so the
# machine's own stay in use. paxlike itself runs from this source tree (on PYTHONPATH).
#
# Parts, in order (levers_1b, qlora_8b, decode_quant and attention run only when --parts names
# them; each part its own process under a wall-clock limit; one that fails or runs out of time
# is recorded with its exit code and last stderr line, and the rest still run):
#   mfu_350m   accelerator_mfu.py: lm.Llama350M at seq 2048 through the trainer and as a bare
#              step, MFU and trainer/bare, and a profile of the bare step (where the time goes)
#   mfu_1b     the same for lm.Llama1B (TinyLlama-1.1B shapes), without the profile
#   levers     levers.py: each lever's bare-step MFU (the tables in benchmarks/levers.py), 350M
#   levers_1b  the same for the 1B's levers (Adafactor, remat, batch: the way to 50% MFU)
#   decode     decode.py --presets: batch 1 and 32 tokens/s of the 350M and 1B models against
#              the HBM roofline, and the first token's latency, decoded unrolled (the default)
#              and by a scan over the layers (no params copy)
#   tpu_tests  tpu_tests.py: pytest on tests/tpu (splash vs XLA attention, TPU vs CPU step)
#   lora_1b    lora.py --preset 1b: a LoRA fine-tune step of the 1B model, steps/s and MFU
#   federated  accelerator_mfu.py --only=federated: federated.ShakespeareFedAvg, 125M, cohort 16
#   dpo, grpo  dpo_step.py, grpo_step.py: step times (GRPO's sampling share of the step)
#   qlora_8b   qlora.py --preset 8b: a LoRA step of Llama-3-8B shapes over an int8 and an NF4
#              base at batch 1 × 2048: ms/step, MFU, the params' and XLA's bytes, and a profile
#              of one step of each
#   decode_quant  decode.py --quantizations: the 1B's decode tokens/s with its base bf16, int8
#              and NF4 (weight-only), each against its own roofline
#   attention  attention_kernels.py: JAX's splash kernel as paxlike calls it and with its keys
#              sequence-minor, tokamax's, and XLA's attention, forward and backward ms at 6 × 2048
#              with 16 heads of 64 and 8 of 128 (each backward compiles in ~27 s on a v5e)
# Seen on a v5e (2026-12-07, JAX 0.10.2): the install 67-83 s (once per machine); mfu_350m 76 s,
# mfu_1b 77 s, decode (scan only) 51 s, tpu_tests 81 s, grpo 39 s, federated 67 s, qlora_8b
# under 300 s; levers ran past 240 s, decode by three layouts past 210 s, and decode_quant's NF4
# rows take ~150 s (NF4 decodes at 32 tokens/s). A part cut by the budget runs
# alone with --parts (e.g. --parts levers --budget 300).
# The models' shapes for the MFU parts (batch, remat) are MODELS in benchmarks/levers.py.
# --quick: tiny shapes on any device (CPU here: the test suite's check of this script); each
#   part may then take up to 300 s within --budget. --budget: seconds for all parts (default
#   500; the install, ~85 s the first time on a machine, comes before it).
# Data: the federated part reads Shakespeare from the data root ($PAXLIKE_DATA_DIR, else
# ../shared/data, else ./tpu-data: a copy carried with the checkout, `mkdir -p tpu-data && cp -r
# ../shared/data/tinyshakespeare tpu-data/`); the trainer parts read this Python's standard
# library. Exit code 0 whenever the JSON was printed. A persistent compilation cache
# (JAX_COMPILATION_CACHE_DIR, default /tmp/paxlike-jax-cache) makes a second run on the same
# machine compile less.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON_BIN="python3"
WHEELS=""
BUDGET=500
QUICK=0
ALL_PARTS="mfu_350m,mfu_1b,levers,decode,tpu_tests,lora_1b,federated,dpo,grpo"
# Not run unless named in --parts (each needs a call of its own on one chip).
MORE_PARTS="levers_1b,qlora_8b,decode_quant,attention"
PARTS="$ALL_PARTS"
SITE="${PAXLIKE_TPU_SITE:-/tmp/paxlike-tpu-site}"
INDEX="${PAXLIKE_TPU_INDEX:-file:///opt/pypi/simple}"
# What paxlike needs beside JAX (ENVIRONMENT.md's TPU section), from the index or the wheels.
PACKAGES="flax==0.12.8 optax orbax-checkpoint absl-py sentencepiece tokenizers safetensors
  pyarrow jinja2 filelock flatbuffers scikit-learn matplotlib fiddle grain array_record clu
  dp-accounting tensorboardX tensorflow-datasets==4.9.10 mpmath<1.4 attrs<24 tokamax"

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
  [[ ",$ALL_PARTS,$MORE_PARTS," == *",$part,"* ]] || die "unknown part $part (see --help)"
done
if [[ -n "$WHEELS" ]]; then
  [[ -d "$WHEELS" ]] || die "--wheels $WHEELS is not a directory"
  WHEELS="$(cd "$WHEELS" && pwd)"
fi

# install: paxlike's dependencies into $SITE from the machine's index and $WHEELS (once: a stamp
# names the wheels folder), then the packages the machine already has are taken out of $SITE.
install() {
  local stamp="$SITE/.paxlike-installed" began=$SECONDS pkg
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$WHEELS" ]]; then
    say "reusing $SITE"; return 0
  fi
  say "installing paxlike's dependencies into $SITE from $INDEX and $WHEELS"
  rm -rf "$SITE"
  # shellcheck disable=SC2086
  PIP_CONFIG_FILE=/dev/null "$PYTHON_BIN" -m pip install --isolated -q --disable-pip-version-check \
    --only-binary=:all: --index-url "$INDEX" --find-links "$WHEELS" --target "$SITE" $PACKAGES >&2 \
    || die "pip could not install paxlike's dependencies (see above)"
  PIP_CONFIG_FILE=/dev/null "$PYTHON_BIN" -m pip install --isolated -q --disable-pip-version-check \
    --only-binary=:all: --index-url "$INDEX" --find-links "$WHEELS" --target "$SITE/pytest" \
    pytest >&2 || say "pytest is in neither $INDEX nor $WHEELS: tpu_tests will be skipped"
  for pkg in jax jaxlib libtpu libtpu_nightly numpy ml_dtypes scipy opt_einsum; do
    if "$PYTHON_BIN" -c "import $pkg" 2>/dev/null; then
      rm -rf "${SITE:?}/$pkg" "$SITE"/"$pkg"-*.dist-info "$SITE"/"$pkg".libs
    fi
  done
  echo "$WHEELS" > "$stamp"
  say "installed in $((SECONDS - began)) s"
}

[[ -n "$WHEELS" ]] && install
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
cd "$REPO"
# The source tree first, the machine's own packages next, what was installed last.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}${WHEELS:+:$SITE:$SITE/pytest}"
if [[ -z "${PAXLIKE_DATA_DIR:-}" && ! -d "$REPO/../shared/data" && -d "$REPO/tpu-data" ]]; then
  export PAXLIKE_DATA_DIR="$REPO/tpu-data"  # A TPU machine has no ../shared: the carried copy.
fi
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-/tmp/paxlike-jax-cache}"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="${JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS:-2}"
(( QUICK )) && Q=(--quick) || Q=()
START=$SECONDS

# run NAME LIMIT -- ARGS...: python ARGS under min(LIMIT, time left), its stdout (JSON lines; the
# last one counts) into $OUT/NAME.json, its exit code into $OUT/NAME.rc.
run() {
  local name="$1" limit="$2" left
  shift 3
  [[ ",$PARTS," == *",$name,"* ]] || return 0
  (( QUICK )) && limit=300
  left=$(( BUDGET - (SECONDS - START) ))
  (( left < limit )) && limit=$left
  if (( limit < 20 )); then echo skipped > "$OUT/$name.rc"; say "$name: skipped (time)"; return 0; fi
  say "$name: up to ${limit}s"
  local began=$SECONDS rc=0
  timeout --signal=KILL "$limit" "$PYTHON_BIN" "$@" \
    > "$OUT/$name.json" 2> >(tee "$OUT/$name.err" >&2) || rc=$?
  echo "$rc" > "$OUT/$name.rc"
  echo $(( SECONDS - began )) > "$OUT/$name.s"
}

PROFILE="$OUT/profile_350m"
if (( QUICK )); then
  run mfu_350m 0 -- -m benchmarks.accelerator_mfu --quick --no-federated --profile "$PROFILE"
  run mfu_1b 0 -- -m benchmarks.accelerator_mfu --quick --no-federated --exp lm.Llama1B
  run levers 0 -- -m benchmarks.levers --quick --time-limit 240
  run levers_1b 0 -- -m benchmarks.levers --quick --model 1b --time-limit 240
  run qlora_8b 0 -- -m benchmarks.qlora --quick --kinds int8,nf4
else
  M350=$("$PYTHON_BIN" -c 'from benchmarks import levers; print(" ".join("--fdl_set=" + o for o in levers.MODELS["350m"][1]))')
  M1B=$("$PYTHON_BIN" -c 'from benchmarks import levers; print(" ".join("--fdl_set=" + o for o in levers.MODELS["1b"][1]))')
  # shellcheck disable=SC2086
  run mfu_350m 100 -- -m benchmarks.accelerator_mfu --exp lm.Llama350M $M350 --no-federated \
    --steps 8 --warmup 2 --profile "$PROFILE" --profile-steps 2
  # shellcheck disable=SC2086
  run mfu_1b 160 -- -m benchmarks.accelerator_mfu --exp lm.Llama1B $M1B --no-federated \
    --steps 5 --warmup 1
  run levers 240 -- -m benchmarks.levers --steps 4 --warmup 1 --time-limit 230
  run levers_1b 240 -- -m benchmarks.levers --model 1b --steps 4 --warmup 1 --time-limit 230
  run qlora_8b 420 -- -m benchmarks.qlora --preset 8b --batch 1 --seq 2048 --kinds int8,nf4 \
    --steps 2 --repeats 1 --profile "$OUT/profile_qlora_8b" --profile-steps 1
fi
run decode 240 -- -m benchmarks.decode --presets 350m,1b --batches 1,32 --new_tokens 128 \
  --prompt_len 128 --repeats 2 --layouts unrolled,scan "${Q[@]}"
run tpu_tests 100 -- -m benchmarks.tpu_tests
run lora_1b 120 -- -m benchmarks.lora --preset 1b --sides lora --steps 10 --repeats 2 "${Q[@]}"
run federated 150 -- -m benchmarks.accelerator_mfu --only=federated --steps 3 --warmup 1 "${Q[@]}"
run dpo 70 -- -m benchmarks.dpo_step --steps 3 --repeats 3 "${Q[@]}"
run grpo 60 -- -m benchmarks.grpo_step --steps 3 "${Q[@]}"
run attention 300 -- -m benchmarks.attention_kernels --heads 16x64,8x128 --steps 10 \
  --variants paxlike,splash_1024_kseq,tokamax_1024,xla "${Q[@]}"
run decode_quant 240 -- -m benchmarks.decode --presets 1b --batches 1,32 --new_tokens 128 \
  --prompt_len 128 --repeats 2 --quantizations none,int8,nf4 --layouts unrolled "${Q[@]}"

"$PYTHON_BIN" - "$OUT" "$PARTS" "$QUICK" "$((SECONDS - START))" <<'EOF'
import json, pathlib, sys
out, parts, quick, total = pathlib.Path(sys.argv[1]), sys.argv[2].split(','), sys.argv[3], sys.argv[4]
result = {'benchmark': 'device_check', 'quick': quick == '1', 'total_s': int(total), 'parts': {}}
for name in parts:
  rc = (out / f'{name}.rc').read_text().strip()
  if rc == 'skipped':
    result['parts'][name] = {'skipped': 'time budget spent'}
    continue
  lines = [l for l in (out / f'{name}.json').read_text().splitlines() if l.startswith('{')]
  part = json.loads(lines[-1]) if lines else {}
  if rc != '0':  # A part killed at its limit keeps the last result it printed (levers).
    err = [l for l in (out / f'{name}.err').read_text().splitlines() if l.strip()]
    part.update({'error': f'exit {rc}' + (' (time limit)' if rc in ('124', '137') else ''),
                 'stderr_last_line': err[-1][-300:] if err else ''})
  part['wall_s'] = int((out / f'{name}.s').read_text())
  result['parts'][name] = part
print(json.dumps(result))
EOF
