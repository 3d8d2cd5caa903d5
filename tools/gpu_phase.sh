# Sourced by the GPU-machine scripts (tools/gpu_device.sh, gpu_switches.sh, gpu_session.sh;
# tools/gpu_run.sh stages it as .gpu/phase.sh): bounded, logged phases. The sourcing script
# sets L (the log folder) and end (the time, in epoch seconds, after which no phase starts).
#   phase NAME TIMEOUT [VAR=VALUE... --] COMMAND...   runs COMMAND (with those variables) into
#                                                      $L/NAME.log; a failure stops nothing
log() { echo "[$(date +%T)] $*" | tee -a "$L/progress.log"; }
phase() {
  local name=$1 t=$2; shift 2
  local envs=()
  while [[ "$1" == *=* ]]; do envs+=("$1"); shift; done
  [ "$1" = "--" ] && shift
  if [ "$(date +%s)" -ge "$end" ]; then log "skip $name: out of time"; return; fi
  log "start $name (${envs[*]:-defaults})"
  env "${envs[@]}" timeout "$t" "$@" > "$L/$name.log" 2>&1
  log "end $name: rc=$? ($(tail -1 "$L/$name.log" | cut -c1-160))"
}
