#!/usr/bin/env bash
# MFU of lm.Llama1B on one NVIDIA GPU (H100/H200), trainer next to bare step, as one JSON line:
# the CUDA-only way in (it builds a CUDA venv). TPUs and any machine with JAX: device_check.sh.
#
#   benchmarks/accelerator_mfu_cuda.sh [--dry-run|--quick] [--python PATH] [--cuda 12|13] [--venv DIR]
#                         [-- <benchmarks/accelerator_mfu.py args, e.g. --batches 32,16 --steps 20>]
#
# Needs only the package registries: makes a venv (default /tmp/paxlike-gpu-venv, reused on the
# next run) and pip-installs jax[cudaNN] at the jax version pinned in constraints.txt, plus this
# project's dependencies under the same constraints. The CUDA major follows the driver (>= 580: 13, else 12)
# unless --cuda says. --python PATH skips the install and uses an interpreter that already has
# a GPU jax (e.g. on a machine with no registry access). Then runs benchmarks/accelerator_mfu.py under
# a TIME_LIMIT (default 290 s) wall-clock limit.
# --dry-run (alias --quick) installs nothing: it prints the install command it would run and
# runs accelerator_mfu.py --quick on CPU with the repo's .venv (or --python), to check this script.
# Prints only the JSON on stdout; progress goes to stderr. Exit code: accelerator_mfu.py's.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GPU_VENV:-/tmp/paxlike-gpu-venv}"
TIME_LIMIT="${TIME_LIMIT:-290}"
PYTHON_BIN=""
CUDA=""
DRY_RUN=0

die() { echo "accelerator_mfu_cuda: error: $*" >&2; exit 2; }
say() { echo "accelerator_mfu_cuda: $*" >&2; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run|--quick) DRY_RUN=1; shift ;;
    --python) [[ $# -ge 2 ]] || die "--python needs a path"; PYTHON_BIN="$2"; shift 2 ;;
    --cuda) [[ $# -ge 2 ]] || die "--cuda needs 12 or 13"; CUDA="$2"; shift 2 ;;
    --venv) [[ $# -ge 2 ]] || die "--venv needs a directory"; VENV="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[[ -z "$CUDA" || "$CUDA" == 12 || "$CUDA" == 13 ]] || die "--cuda must be 12 or 13, got $CUDA"

JAX_PIN="$(sed -n 's/^jax==\(.*\)$/\1/p' "$REPO/constraints.txt")"
[[ -n "$JAX_PIN" ]] || die "no jax== pin in $REPO/constraints.txt"

# A Python >= 3.12 for the venv (jax >= 0.11 needs it): PATH first, then pyenv's versions.
find_python() {
  local c
  for c in python3.12 python3.13 python3; do
    c="$(command -v "$c" 2>/dev/null)" || continue
    "$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { echo "$c"; return; }
  done
  for c in "$(pyenv root 2>/dev/null)"/versions/3.1[2-9]*/bin/python3 "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python3; do
    [[ -x "$c" ]] && { echo "$c"; return; }
  done
  return 1
}

cuda_major() {
  local driver
  command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this needs an NVIDIA GPU (--dry-run checks the script on CPU)"
  driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1)"
  [[ -n "$driver" ]] || die "nvidia-smi reports no GPU"
  say "driver $driver, GPU $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)"
  if (( ${driver%%.*} >= 580 )); then echo 13; else echo 12; fi
}

if (( DRY_RUN )); then
  say "dry run: would install 'jax[cuda${CUDA:-<12|13 by driver>}]==$JAX_PIN' $REPO into $VENV"
  if [[ -z "$PYTHON_BIN" ]]; then
    PYTHON_BIN="$REPO/.venv/bin/python"
    [[ -x "$PYTHON_BIN" ]] || PYTHON_BIN="$(find_python)" || die "no Python >= 3.12 found"
  fi
  export JAX_PLATFORMS=cpu
  set -- --quick "$@"
elif [[ -z "$PYTHON_BIN" ]]; then
  CUDA="${CUDA:-$(cuda_major)}"
  STAMP="$VENV/.paxlike-jax-$JAX_PIN-cuda$CUDA"
  if [[ ! -f "$STAMP" ]]; then
    BASE_PYTHON="$(find_python)" || die "needs Python >= 3.12 (jax $JAX_PIN); install one or pass --python"
    say "installing jax[cuda$CUDA]==$JAX_PIN and paxlike's dependencies into $VENV (one-time)"
    began=$SECONDS
    [[ -x "$VENV/bin/python" ]] || "$BASE_PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip >&2
    "$VENV/bin/python" -m pip install -q -c "$REPO/constraints.txt" \
      "jax[cuda$CUDA]==$JAX_PIN" "$REPO" >&2
    touch "$STAMP"
    say "installed in $((SECONDS - began)) s"
  fi
  PYTHON_BIN="$VENV/bin/python"
  export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}"
fi

[[ -x "$PYTHON_BIN" ]] || command -v "$PYTHON_BIN" >/dev/null || die "no interpreter at $PYTHON_BIN"
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
exec timeout --signal=TERM --kill-after=15 "$TIME_LIMIT" "$PYTHON_BIN" -m benchmarks.accelerator_mfu "$@"
