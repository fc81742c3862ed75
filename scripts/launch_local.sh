#!/usr/bin/env bash
# Runs one paxlike job as N local processes on 127.0.0.1 (jax.distributed over loopback, CPU).
#
#   scripts/launch_local.sh N -- <paxlike args>
#   scripts/launch_local.sh 2 -- --exp=lm.StdlibTiny --fdl_fiddler=tiny --job_log_dir=/tmp/mp
#
# Each process gets DEVICES_PER_PROCESS forced CPU devices (default 8/N, at least 1), so N
# processes form the same global mesh as one process with 8 devices. Process i logs to
# <job_log_dir>/logs/process_<i>.log (appended: a resumed run keeps the earlier logs); process 0
# is also echoed to this terminal.
# Fail fast: if any process exits non-zero, the others are killed and this script exits with
# that code; otherwise it exits with process 0's code. SIGTERM/SIGINT are forwarded to every
# process (they save a checkpoint at a common step and exit 0); a second one kills them.
#
# Environment: PORT (coordinator port; default: a free one), DEVICES_PER_PROCESS,
# PYTHON (default: .venv/bin/python in the repo if present, else python3), JAX_PLATFORMS
# (default cpu), XLA_FLAGS (kept; the device count is appended).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$REPO/scripts/launch_lib.sh"

die() { echo "launch_local: error: $*" >&2; exit 2; }

[[ $# -ge 1 ]] || die "usage: $0 N -- <paxlike args>"
if [[ "$1" == -h || "$1" == --help ]]; then
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
NUM_PROCESSES="$1"
shift
[[ "$NUM_PROCESSES" =~ ^[1-9][0-9]*$ ]] || die "N must be a positive integer, got '$NUM_PROCESSES'"
[[ "${1:-}" == "--" ]] && shift
ARGS=("$@")

if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$REPO/.venv/bin/python" ]]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python3; fi
fi

DEVICES_PER_PROCESS="${DEVICES_PER_PROCESS:-$(( 8 / NUM_PROCESSES ))}"
[[ "$DEVICES_PER_PROCESS" =~ ^[0-9]+$ ]] || die "DEVICES_PER_PROCESS must be an integer"
(( DEVICES_PER_PROCESS >= 1 )) || DEVICES_PER_PROCESS=1

# The job dir (last --job_log_dir wins, as with absl flags) holds the logs.
JOB_LOG_DIR="$(last_job_log_dir "${ARGS[@]}")"
if [[ -n "$JOB_LOG_DIR" ]]; then
  LOG_DIR="${JOB_LOG_DIR/#\~/$HOME}/logs"
else
  LOG_DIR="$(mktemp -d "${TMPDIR:-/tmp}/paxlike_launch.XXXXXX")/logs"
fi
mkdir -p "$LOG_DIR" || die "cannot create $LOG_DIR"

if [[ -z "${PORT:-}" ]]; then
  PORT="$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
fi

export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
# Drop any device count already in XLA_FLAGS, keep the rest.
XLA_FLAGS_BASE="$(printf '%s' "${XLA_FLAGS:-}" | sed -E 's/--xla_force_host_platform_device_count=[0-9]+//g')"
export XLA_FLAGS="${XLA_FLAGS_BASE:+$XLA_FLAGS_BASE }--xla_force_host_platform_device_count=$DEVICES_PER_PROCESS"

# Where the OS can, a process dies with the launcher, so a killed launcher leaves no orphans.
WRAP=()
if setpriv --pdeathsig KILL true 2>/dev/null; then WRAP=(setpriv --pdeathsig KILL); fi

PIDS=()
STOPPING=0

kill_all() {  # kill_all SIGNAL: signals every process still running.
  local pid
  for pid in ${PIDS[@]+"${PIDS[@]}"}; do kill "-$1" "$pid" 2>/dev/null || true; done
}
on_signal() {
  if (( STOPPING )); then
    echo "launch_local: second signal: killing all processes" >&2
    kill_all KILL
  else
    STOPPING=1
    echo "launch_local: $1: asking all processes to checkpoint and exit (again to kill)" >&2
    kill_all TERM
  fi
}
trap 'on_signal SIGTERM' TERM
trap 'on_signal SIGINT' INT
trap 'on_signal SIGHUP' HUP
trap 'kill_all KILL' EXIT

echo "launch_local: $NUM_PROCESSES processes x $DEVICES_PER_PROCESS CPU devices," \
     "coordinator 127.0.0.1:$PORT, logs in $LOG_DIR" >&2
for (( i = 0; i < NUM_PROCESSES; i++ )); do
  cmd=(${WRAP[@]+"${WRAP[@]}"} "$PYTHON" -m paxlike.main ${ARGS[@]+"${ARGS[@]}"} "--coordinator_address=127.0.0.1:$PORT"
       "--num_processes=$NUM_PROCESSES" "--process_id=$i")
  log="$LOG_DIR/process_$i.log"
  echo "=== $(date -u +%Y-%m-%dT%H:%M:%SZ) launch_local: process $i of $NUM_PROCESSES ===" >> "$log"
  if (( i == 0 )); then
    "${cmd[@]}" > >(tee -a "$log") 2> >(tee -a "$log" >&2) &
  else
    "${cmd[@]}" >> "$log" 2>&1 &
  fi
  PIDS+=("$!")
done

# Poll rather than `wait -n`: traps run between polls, and it works on old bash too. Every
# process found dead in one poll is reported: when one dies, its peers abort within a moment
# (JAX's coordination service), so several can be found at once, the cause among them.
declare -a CODES=()
remaining=$NUM_PROCESSES
while (( remaining > 0 )); do
  failed=()
  for (( i = 0; i < NUM_PROCESSES; i++ )); do
    [[ -n "${CODES[i]:-}" ]] && continue
    kill -0 "${PIDS[i]}" 2>/dev/null && continue
    rc=0
    wait "${PIDS[i]}" 2>/dev/null || rc=$?
    CODES[i]=$rc
    remaining=$(( remaining - 1 ))
    (( rc != 0 )) && failed+=("$i")
  done
  if (( ${#failed[@]} > 0 )); then
    for i in "${failed[@]}"; do
      rc=${CODES[i]}
      how="exited with code $rc"
      (( rc > 128 )) && how="was killed by SIG$(kill -l $(( rc - 128 )) 2>/dev/null || echo $(( rc - 128 )))"
      echo "launch_local: process $i $how; killing the others (log: $LOG_DIR/process_$i.log)" >&2
      if (( i != 0 )); then tail -n 5 "$LOG_DIR/process_$i.log" | sed "s/^/  [process $i] /" >&2; fi
    done
    kill_all KILL
    wait 2>/dev/null || true
    trap - EXIT
    exit "${CODES[${failed[0]}]}"
  fi
  (( remaining > 0 )) && sleep 0.2
done
wait 2>/dev/null || true  # The tee's of process 0.
trap - EXIT
exit "${CODES[0]}"
