# Helpers the launch scripts source (not a script to run).

# Prints the value of the last --job_log_dir in "$@" (absl takes the last), or nothing.
last_job_log_dir() {
  local dir="" k
  local -a args=("$@")
  for (( k = 0; k < ${#args[@]}; k++ )); do
    case "${args[k]}" in
      --job_log_dir=*) dir="${args[k]#--job_log_dir=}" ;;
      --job_log_dir) if (( k + 1 < ${#args[@]} )); then dir="${args[k + 1]}"; fi ;;
    esac
  done
  printf '%s' "$dir"
}
