#!/usr/bin/env bash
# Submits a paxlike job to a Slurm GPU cluster: writes an sbatch script, then runs sbatch on it.
#
#   scripts/launch_slurm.sh [--dry-run] [--nodes=N] [--gpus_per_node=G] [--partition=P]
#       [--time=HH:MM:SS] [--account=A] [--process_per_node] [--run_name=NAME] -- <paxlike args>
#
#   NODES=2 GPUS_PER_NODE=8 PARTITION=gpu \
#     scripts/launch_slurm.sh -- --exp=lm.StdlibTiny --job_log_dir=/shared/runs/tiny
#
# Settings come from the environment or the same-named lower-case flags (flags win):
#   NODES, GPUS_PER_NODE, PARTITION  required. TIME and ACCOUNT optional.
#   One process per GPU by default (--ntasks-per-node=G, --gpus-per-task=1); --process_per_node
#   (or PROCESS_PER_NODE=1) runs one process per node that drives all G GPUs.
#   JAX finds the coordinator, process count and rank in SLURM_* (jax.distributed.initialize()).
#   RUN_NAME default paxlike-<UTC timestamp>; the job dir is $HOME/paxlike_runs/<RUN_NAME>
#   unless --job_log_dir is given. It must be on a filesystem all nodes share. Rank r logs to
#   <job dir>/logs/process_<r>.log; the sbatch script is kept in <job dir>/logs/.
#   XLA_FLAGS is added after the GPU defaults below (later flags win).
#   PYTHON: the Python on the nodes (default: this checkout's .venv/bin/python, which needs
#   jax[cuda12]: `make setup && .venv/bin/pip install -c constraints.txt 'jax[cuda12]'`).
# --dry-run prints the sbatch script and the sbatch command without writing or submitting.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$REPO/scripts/launch_lib.sh"
PROG=launch_slurm
# Overlap collectives with compute; flags XLA does not know abort the job, so keep this short.
GPU_XLA_FLAGS="--xla_gpu_enable_latency_hiding_scheduler=true"

die() { echo "$PROG: error: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

DRY_RUN=0
NODES="${NODES:-}"
GPUS_PER_NODE="${GPUS_PER_NODE:-}"
PARTITION="${PARTITION:-}"
TIME="${TIME:-}"
ACCOUNT="${ACCOUNT:-}"
PROCESS_PER_NODE="${PROCESS_PER_NODE:-0}"
RUN_NAME="${RUN_NAME:-paxlike-$(date -u +%Y%m%d-%H%M%S)}"
if [[ -z "${PYTHON:-}" ]]; then PYTHON="$REPO/.venv/bin/python"; fi

while (( $# )); do
  opt="$1"
  case "$opt" in
    --) shift; break ;;
    --dry-run|--dry_run) DRY_RUN=1; shift; continue ;;
    --process_per_node) PROCESS_PER_NODE=1; shift; continue ;;
    -h|--help) usage; exit 0 ;;
    --*=*) name="${opt%%=*}"; value="${opt#*=}"; shift ;;
    --*) name="$opt"; (( $# >= 2 )) || die "$opt needs a value"; value="$2"; shift 2 ;;
    *) die "unexpected argument '$opt' (paxlike args go after --)" ;;
  esac
  case "$name" in
    --nodes) NODES="$value" ;;
    --gpus_per_node) GPUS_PER_NODE="$value" ;;
    --partition) PARTITION="$value" ;;
    --time) TIME="$value" ;;
    --account) ACCOUNT="$value" ;;
    --run_name) RUN_NAME="$value" ;;
    *) die "unknown option $name (paxlike args go after --)" ;;
  esac
done
ARGS=("$@")

missing=()
[[ -n "$NODES" ]] || missing+=(NODES)
[[ -n "$GPUS_PER_NODE" ]] || missing+=(GPUS_PER_NODE)
[[ -n "$PARTITION" ]] || missing+=(PARTITION)
if (( ${#missing[@]} )); then
  names="$(IFS=,; echo "${missing[*]}")"
  flags_hint="$(printf -- '--%s=, ' "${missing[@]}" | tr '[:upper:]' '[:lower:]')"
  die "missing ${names//,/, }: set the environment variable(s) or pass ${flags_hint%, }"
fi
[[ "$NODES" =~ ^[1-9][0-9]*$ ]] || die "NODES must be a positive integer, got '$NODES'"
[[ "$GPUS_PER_NODE" =~ ^[1-9][0-9]*$ ]] || die "GPUS_PER_NODE must be a positive integer, got '$GPUS_PER_NODE'"
(( ${#ARGS[@]} )) || die "no paxlike args: pass them after --, e.g. -- --exp=lm.StdlibTiny"
[[ "$RUN_NAME" =~ ^[A-Za-z0-9._-]+$ ]] || die "run name '$RUN_NAME' may only hold letters, digits, . _ -"

# The job dir (last --job_log_dir wins, as with absl flags), else a per-run default.
JOB_LOG_DIR="$(last_job_log_dir "${ARGS[@]}")"
JOB_LOG_DIR="${JOB_LOG_DIR:-$HOME/paxlike_runs/$RUN_NAME}"
JOB_LOG_DIR="${JOB_LOG_DIR/#\~/$HOME}"
[[ "$JOB_LOG_DIR" == /* ]] || JOB_LOG_DIR="$PWD/$JOB_LOG_DIR"
# Pass it on as one absolute --job_log_dir, so logs and job dir agree wherever the job runs.
kept=()
for (( k = 0; k < ${#ARGS[@]}; k++ )); do
  case "${ARGS[k]}" in
    --job_log_dir=*) ;;
    --job_log_dir) k=$(( k + 1 )) ;;
    *) kept+=("${ARGS[k]}") ;;
  esac
done
ARGS=(${kept[@]+"${kept[@]}"} "--job_log_dir=$JOB_LOG_DIR")
[[ "$JOB_LOG_DIR" != *[[:space:]]* ]] || die "the job dir '$JOB_LOG_DIR' holds whitespace, which #SBATCH lines cannot carry"
LOG_DIR="$JOB_LOG_DIR/logs"
SCRIPT="$LOG_DIR/$RUN_NAME.sbatch"

if (( PROCESS_PER_NODE )); then
  tasks="#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=$GPUS_PER_NODE"
  # JAX's Slurm detection would drive only GPU SLURM_LOCALID (= 0): let each process use all.
  local_ids="$(seq -s, 0 $(( GPUS_PER_NODE - 1 )))"
else
  tasks="#SBATCH --ntasks-per-node=$GPUS_PER_NODE
#SBATCH --gpus-per-task=1"
  # Each task sees only its own GPU, as device 0; JAX's Slurm detection would pick device
  # SLURM_LOCALID, which does not exist in the task for SLURM_LOCALID > 0.
  local_ids=0
fi
optional=""
[[ -n "$TIME" ]] && optional+="#SBATCH --time=$TIME
#SBATCH --signal=TERM@120
"
[[ -n "$ACCOUNT" ]] && optional+="#SBATCH --account=$ACCOUNT
"
xla_flags="$GPU_XLA_FLAGS${XLA_FLAGS:+ $XLA_FLAGS}"
command="$(printf '%q' "$PYTHON") -m paxlike.main"
for arg in "${ARGS[@]}"; do command+=" $(printf '%q' "$arg")"; done

sbatch_script="#!/bin/bash
#SBATCH --job-name=$RUN_NAME
#SBATCH --nodes=$NODES
$tasks
#SBATCH --partition=$PARTITION
${optional}#SBATCH --output=$LOG_DIR/slurm-%j.out
# paxlike job written by scripts/launch_slurm.sh. SIGTERM (preemption, or 120 s before --time)
# makes every rank save a checkpoint at the same step and exit 0; resubmit to resume.
set -euo pipefail
cd $(printf '%q' "$PWD")
export PYTHONPATH=$(printf '%q' "$REPO")\${PYTHONPATH:+:\$PYTHONPATH}
export XLA_FLAGS=$(printf '%q' "$xla_flags")
export JAX_LOCAL_DEVICE_IDS=$local_ids
srun --kill-on-bad-exit=1 --output=$(printf '%q' "$LOG_DIR")/process_%t.log \\
  $command
"

if (( DRY_RUN )); then
  printf '%s' "$sbatch_script"
  echo "sbatch $(printf '%q' "$SCRIPT")"
  exit 0
fi
command -v sbatch >/dev/null || die "sbatch not found: run this on a Slurm login node (or use --dry-run)"
mkdir -p "$LOG_DIR"
printf '%s' "$sbatch_script" > "$SCRIPT"
echo "$PROG: submitting $SCRIPT (logs: $LOG_DIR/process_<rank>.log)" >&2
sbatch "$SCRIPT"
