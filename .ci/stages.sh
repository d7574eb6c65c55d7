# Sourced by .ci/run: `stage NAME COMMAND...` runs one CI stage and prints its wall time, and when
# the script ends (passed or failed) one line per stage, so a stage that grows is seen at every
# run (docs/tests.md: CI's budget is 60 minutes on 2 cores, never a timed assertion).
CI_STAGES=()
CI_STAGE_NOW=""
CI_STAGE_START=$SECONDS

ci_minutes() {  # seconds -> "M min S s"
  printf '%d min %02d s' $(($1 / 60)) $(($1 % 60))
}

stage() {
  CI_STAGE_NOW=$1
  CI_STAGE_START=$SECONDS
  shift
  echo "[ci] stage $CI_STAGE_NOW: $*"
  "$@"
  local took=$((SECONDS - CI_STAGE_START))
  CI_STAGES+=("$CI_STAGE_NOW $(ci_minutes $took)")
  echo "[ci] stage $CI_STAGE_NOW: done in $(ci_minutes $took)"
  CI_STAGE_NOW=""
}

ci_summary() {
  local status=$?
  echo "[ci] stage times:"
  local line
  for line in ${CI_STAGES[@]+"${CI_STAGES[@]}"}; do
    echo "[ci]   $line"
  done
  if [ -n "$CI_STAGE_NOW" ]; then
    echo "[ci]   $CI_STAGE_NOW FAILED (exit $status) after $(ci_minutes $((SECONDS - CI_STAGE_START)))"
  fi
  echo "[ci] total $(ci_minutes $SECONDS) (exit $status)"
}
trap ci_summary EXIT
