# Shell helpers shared by tools/arm64_check.sh and tools/fresh_check.sh; sourced, not run.
#
# The sourcing script sets, before sourcing:
#   CHECK        its name in messages ("arm64 check")
#   IF_POSSIBLE  1: skip_or_fail says SKIPPED and exits 0
# and, before calling quiet, WORK (logs go to $WORK/logs).  It may define check_cleanup,
# which the EXIT trap calls instead of unmount_all (it must call unmount_all itself).
# Sourcing installs the ERR and EXIT traps; `phase NAME` starts a timed phase, and at exit
# the time of each phase is printed, with the phase (and command) a failure happened in.
# shellcheck shell=bash

START_NS=$(date +%s%N)
PHASE="start"
PHASE_NS=$START_NS
TIMES=()
MOUNTED=()
FAILED_PHASE=""
FAILED_COMMAND=""
# The script's own output: a signal can end it while quiet has a function's output redirected
# to a log, and the exit handler must still print on the terminal.
exec {CHECK_STDOUT}>&1 {CHECK_STDERR}>&2

phase() {
  local now
  now=$(date +%s%N)
  [[ $PHASE == start ]] || TIMES+=("$(printf '%-34s %7.1f s' "$PHASE" "$(((now - PHASE_NS) / 1000000))e-3")")
  PHASE=$1
  PHASE_NS=$now
  [[ $PHASE == "done" ]] || echo "== $CHECK: $PHASE"
}

# Mount (the arguments of mount, the mount point last) and remember it for unmount_all.
mount_tracked() {
  mount "$@"
  MOUNTED+=("${*: -1}")
}

# Undo what mount_tracked mounted, last first.
unmount_all() {
  local m
  for ((m = ${#MOUNTED[@]} - 1; m >= 0; m--)); do
    umount "${MOUNTED[m]}" 2>/dev/null || umount -l "${MOUNTED[m]}"
  done
  MOUNTED=()
}

_check_exit() {
  local rc=$? failed=${FAILED_PHASE:-$PHASE} interrupted=0
  set +e
  exec 1>&"$CHECK_STDOUT" 2>&"$CHECK_STDERR"
  # Ended by a signal (bash then runs this with $? 0, and dies of the signal after it).
  [[ $rc != 0 || $PHASE == "done" ]] || interrupted=1
  if declare -F check_cleanup >/dev/null; then check_cleanup; else unmount_all; fi
  [[ $PHASE == "done" ]] || phase "done"
  echo "-- $CHECK: time per phase"
  ((${#TIMES[@]} == 0)) || printf '   %s\n' "${TIMES[@]}"
  printf '   %-34s %7.1f s\n' "total (wall)" "$((($(date +%s%N) - START_NS) / 1000000))e-3"
  if ((interrupted)); then
    echo "$CHECK: INTERRUPTED in phase '$failed'" >&2
    rc=1
  elif ((rc != 0)); then
    echo "$CHECK: FAILED in phase '$failed' (exit $rc)${FAILED_COMMAND:+ at $FAILED_COMMAND}" >&2
  fi
  exit $rc
}
# The failing command's line; its text too, unless that is a function's `return 1` (quiet's).
trap '[[ -n $FAILED_PHASE ]] || { FAILED_PHASE=$PHASE; FAILED_COMMAND="line $LINENO"
  [[ $BASH_COMMAND == return* ]] || FAILED_COMMAND+=": $BASH_COMMAND"; }' ERR
trap _check_exit EXIT

skip_or_fail() {
  if ((IF_POSSIBLE)); then
    echo "$CHECK: SKIPPED: $1"
    PHASE="done"
    exit 0
  fi
  echo "$CHECK: $1" >&2
  FAILED_PHASE=$PHASE
  exit 1
}

# Run a command quietly; on failure show the end of its output.
quiet() {
  local log=$WORK/logs/$1
  shift
  if ! "$@" >"$log" 2>&1; then
    echo "$CHECK: command failed: $*" >&2
    tail -n 40 "$log" >&2
    return 1
  fi
}

# The Debian mirror apt already uses (deb822 or one-line sources), else Debian's CDN.
debian_mirror() {
  local mirror
  mirror=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
    grep -oE '^(URIs:|deb) +https?://[^ ]+/debian/?$|^(URIs:|deb) +https?://[^ ]+/debian ' | head -n1 | awk '{print $2}' || true)
  echo "${mirror:-http://deb.debian.org/debian}"
}
