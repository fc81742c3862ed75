#!/usr/bin/env bash
# Runs a paxlike job on every worker of a Cloud TPU VM slice (or of N slices: multislice).
#
#   scripts/launch_tpu_pod.sh [--dry-run] [--tpu_name=NAME] [--zone=ZONE] [--project=PROJECT]
#       [--num_slices=N] [--ref=GIT_REF] [--run_name=NAME] -- <paxlike args>
#
#   TPU_NAME=my-v5p-32 ZONE=us-east5-a PROJECT=my-proj \
#     scripts/launch_tpu_pod.sh -- --exp=lm.StdlibTiny --job_log_dir=/mnt/shared/runs/tiny
#
# Settings come from the environment or the same-named lower-case flags (flags win):
#   TPU_NAME, ZONE, PROJECT  required. With NUM_SLICES > 1, TPU_NAME names a queued resource
#                            whose nodes are TPU_NAME-0 .. TPU_NAME-(N-1); it is created
#                            (--node-count=N) when it does not exist yet.
#   NUM_SLICES               default 1. ACCELERATOR_TYPE and RUNTIME_VERSION are required when > 1.
#   REF                      pip-install paxlike at this git ref (from REPO_URL, default: this
#                            checkout's `origin`) instead of copying this working tree.
#   RUN_NAME                 default paxlike-<UTC timestamp>; the job dir is
#                            $HOME/paxlike_runs/<RUN_NAME> on the workers unless --job_log_dir is
#                            given. Multi-host jobs need a job dir on a filesystem every worker
#                            shares (NFS, Filestore, a gcsfuse mount).
#   REMOTE_PYTHON            Python on the workers (default python3): >= 3.12 installs with
#                            constraints.txt (jax 0.12), 3.11 with constraints-py311.txt (jax 0.10).
#   XLA_FLAGS, LIBTPU_INIT_ARGS  passed through to the workers when set.
# --dry-run prints every command (shell-quoted, one per line) instead of running it.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROG=launch_tpu_pod

die() { echo "$PROG: error: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

DRY_RUN=0
TPU_NAME="${TPU_NAME:-}"
ZONE="${ZONE:-}"
PROJECT="${PROJECT:-}"
NUM_SLICES="${NUM_SLICES:-1}"
REF="${REF:-}"
RUN_NAME="${RUN_NAME:-paxlike-$(date -u +%Y%m%d-%H%M%S)}"
ACCELERATOR_TYPE="${ACCELERATOR_TYPE:-}"
RUNTIME_VERSION="${RUNTIME_VERSION:-}"
REPO_URL="${REPO_URL:-}"
REMOTE_PYTHON="${REMOTE_PYTHON:-python3}"

while (( $# )); do
  opt="$1"
  case "$opt" in
    --) shift; break ;;
    --dry-run|--dry_run) DRY_RUN=1; shift; continue ;;
    -h|--help) usage; exit 0 ;;
    --*=*) name="${opt%%=*}"; value="${opt#*=}"; shift ;;
    --*) name="$opt"; (( $# >= 2 )) || die "$opt needs a value"; value="$2"; shift 2 ;;
    *) die "unexpected argument '$opt' (paxlike args go after --)" ;;
  esac
  case "$name" in
    --tpu_name) TPU_NAME="$value" ;;
    --zone) ZONE="$value" ;;
    --project) PROJECT="$value" ;;
    --num_slices) NUM_SLICES="$value" ;;
    --ref) REF="$value" ;;
    --run_name) RUN_NAME="$value" ;;
    --accelerator_type) ACCELERATOR_TYPE="$value" ;;
    --runtime_version) RUNTIME_VERSION="$value" ;;
    --repo_url) REPO_URL="$value" ;;
    *) die "unknown option $name (paxlike args go after --)" ;;
  esac
done
ARGS=("$@")

# Every required setting, checked before anything runs.
missing=()
[[ -n "$TPU_NAME" ]] || missing+=(TPU_NAME)
[[ -n "$ZONE" ]] || missing+=(ZONE)
[[ -n "$PROJECT" ]] || missing+=(PROJECT)
[[ "$NUM_SLICES" =~ ^[1-9][0-9]*$ ]] || die "NUM_SLICES must be a positive integer, got '$NUM_SLICES'"
if (( NUM_SLICES > 1 )); then
  [[ -n "$ACCELERATOR_TYPE" ]] || missing+=(ACCELERATOR_TYPE)
  [[ -n "$RUNTIME_VERSION" ]] || missing+=(RUNTIME_VERSION)
fi
if (( ${#missing[@]} )); then
  names="$(IFS=,; echo "${missing[*]}")"
  flags_hint="$(printf -- '--%s=, ' "${missing[@]}" | tr '[:upper:]' '[:lower:]')"
  die "missing ${names//,/, }: set the environment variable(s) or pass ${flags_hint%, }"
fi
(( ${#ARGS[@]} )) || die "no paxlike args: pass them after --, e.g. -- --exp=lm.StdlibTiny"
[[ "$RUN_NAME" =~ ^[A-Za-z0-9._-]+$ ]] || die "run name '$RUN_NAME' may only hold letters, digits, . _ -"
if [[ -n "$REF" && -z "$REPO_URL" ]]; then
  REPO_URL="$(git -C "$REPO" remote get-url origin 2>/dev/null)" \
    || die "--ref needs REPO_URL (or --repo_url=): this checkout has no 'origin' remote"
fi

shell_quote() {  # Like Python's shlex.quote: plain words as they are, others in '...'.
  if [[ "$1" =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then printf '%s' "$1"
  else printf "'%s'" "${1//\'/\'\"\'\"\'}"; fi
}
run() {  # run CMD...: prints it shell-quoted (dry run) or runs it.
  if (( DRY_RUN )); then
    local word line=""
    for word in "$@"; do line+="$(shell_quote "$word") "; done
    echo "${line% }"
  else
    "$@"
  fi
}
note() { if (( DRY_RUN )); then echo "# $*"; else echo "$PROG: $*" >&2; fi; }

GCLOUD=(gcloud compute tpus tpu-vm)
TARGET=("$TPU_NAME")
if (( NUM_SLICES > 1 )); then
  GCLOUD=(gcloud compute tpus queued-resources)
  TARGET=("$TPU_NAME" --node=all)
fi
WHERE=(--worker=all "--zone=$ZONE" "--project=$PROJECT")

# The command every worker runs, each word quoted so user args survive the remote shell.
q() { printf '%q' "$1"; }
VENV='"$HOME"/paxlike_venv'
CODE='"$HOME"/paxlike_code-'"$RUN_NAME"
remote=("{ [ -x $VENV/bin/python ] || $(q "$REMOTE_PYTHON") -m venv $VENV; }")
if [[ -n "$REF" ]]; then
  remote+=("$VENV/bin/python -m pip install -q $(q "paxlike @ git+$REPO_URL@$REF") 'jax[tpu]'"
           "cd \"\$HOME\"")
else
  remote+=("mkdir -p $CODE" "tar -xzf $CODE.tar.gz -C $CODE" "rm $CODE.tar.gz" "cd $CODE"
           "{ c=constraints.txt; $VENV/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 12))' || c=constraints-py311.txt; $VENV/bin/python -m pip install -q -c \$c -e . 'jax[tpu]'; }")
fi
[[ -n "${XLA_FLAGS:-}" ]] && remote+=("export XLA_FLAGS=$(q "$XLA_FLAGS")")
[[ -n "${LIBTPU_INIT_ARGS:-}" ]] && remote+=("export LIBTPU_INIT_ARGS=$(q "$LIBTPU_INIT_ARGS")")
main="$VENV/bin/python -m paxlike.main"
has_job_dir=0
for arg in "${ARGS[@]}"; do
  main+=" $(q "$arg")"
  [[ "$arg" == --job_log_dir || "$arg" == --job_log_dir=* ]] && has_job_dir=1
done
(( has_job_dir )) || main+=" --job_log_dir=\"\$HOME\"/paxlike_runs/$RUN_NAME"
remote+=("$main")
REMOTE_COMMAND="${remote[0]}"
for part in "${remote[@]:1}"; do REMOTE_COMMAND+=" && $part"; done

note "run $RUN_NAME on $TPU_NAME ($NUM_SLICES slice(s)), zone $ZONE, project $PROJECT"
if (( NUM_SLICES > 1 )); then
  QR=(gcloud compute tpus queued-resources)
  if (( DRY_RUN )) || ! "${QR[@]}" describe "$TPU_NAME" "--zone=$ZONE" "--project=$PROJECT" >/dev/null 2>&1; then
    note "create the queued resource unless it exists, then wait until it is ACTIVE"
    run "${QR[@]}" create "$TPU_NAME" "--node-count=$NUM_SLICES" "--node-prefix=$TPU_NAME" \
        "--accelerator-type=$ACCELERATOR_TYPE" "--runtime-version=$RUNTIME_VERSION" \
        "--zone=$ZONE" "--project=$PROJECT"
  fi
  state_cmd=("${QR[@]}" describe "$TPU_NAME" "--zone=$ZONE" "--project=$PROJECT" '--format=value(state.state)')
  if (( DRY_RUN )); then
    run "${state_cmd[@]}"
  else
    until [[ "$("${state_cmd[@]}")" == ACTIVE ]]; do note "waiting for $TPU_NAME to be ACTIVE"; sleep 30; done
  fi
fi
if [[ -z "$REF" ]]; then
  TARBALL="${TMPDIR:-/tmp}/paxlike_code-$RUN_NAME.tar.gz"
  (( DRY_RUN )) || trap 'rm -f "$TARBALL"' EXIT
  # tar exits 1 when a file changed while it was read (an editor saving): that copy is fine.
  run tar -czf "$TARBALL" --exclude=./.venv --exclude=./.venv-py311 --exclude=./.git --exclude=__pycache__ \
      --exclude=./.pytest_cache -C "$REPO" . || (( $? == 1 ))
  run "${GCLOUD[@]}" scp "$TARBALL" "${TARGET[0]}:paxlike_code-$RUN_NAME.tar.gz" \
      "${TARGET[@]:1}" "${WHERE[@]}"
fi
run "${GCLOUD[@]}" ssh "${TARGET[@]}" "${WHERE[@]}" "--command=$REMOTE_COMMAND"
