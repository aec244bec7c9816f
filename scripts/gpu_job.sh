#!/usr/bin/env bash
# One lent-GPU job, one command (issue #40; docs/gpu-suite.md):
#
#   scripts/gpu_job.sh [--minutes N] [--bundle DIR] [--dry-run] [osfl suite run options...]
#
# installs the wheels carried in gpu_pack/wheels beside the machine's own
# packages (osfl itself runs from this source tree), then runs
# `osfl suite run` (measure the rates, plan, run the steps in order of value)
# under an inner timeout that leaves a minute of the command's N minutes
# (default 10: a lent machine's limit per command) to write the bundle, and
# writes the bundle into DIR (default $OUT, the folder a lent machine hands
# back; else runs/suite/bundle). The inner timeout sends SIGINT: the suite
# stops like on Ctrl-C, marks the step it was in, and the bundle keeps every
# step that finished. Any other argument goes to `osfl suite run`
# (--sections, --steps, --out, --dry-run, --rates). A CPU dry run of this
# very script is tests/test_suite_job.py.
set -uo pipefail

MINUTES=10
BUNDLE="${OUT:-}"
PYTHON="${PYTHON:-python3}"
PACK="${OSFL_PACK:-gpu_pack}"
SUITE_OUT="runs/suite"
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) MINUTES="$2"; shift 2 ;;
    --bundle) BUNDLE="$2"; shift 2 ;;
    --out) SUITE_OUT="$2"; shift 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
BUNDLE="${BUNDLE:-$SUITE_OUT/bundle}"
cd "$(dirname "$0")/.." || exit 2
mkdir -p "$SUITE_OUT" "$BUNDLE" || exit 2

# 1. the packages the lent machine's image lacks (osfl.suite.pack.LENT_MACHINE_LACKS)
if compgen -G "$PACK/wheels/*.whl" >/dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/osfl-site "$PACK"/wheels/*.whl || exit 2
  export PYTHONPATH="/tmp/osfl-site:$PWD/src"
else
  export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
# osfl must start before any minute is spent (a package missing from the pack:
# say which, in the bundle's log)
if ! "$PYTHON" -c "import omegaconf, osfl.cli, osfl.suite.execute" >"$BUNDLE/job.log" 2>&1; then
  echo "gpu_job.sh: osfl cannot start here (a package missing from $PACK/wheels?)" \
    | tee -a "$BUNDLE/job.log" >&2
  exit 2
fi

# 2. measure, plan, run: the inner limit leaves a minute for the bundle, the
#    plan's budget another half-minute of head-room inside it
INNER=${OSFL_JOB_INNER_S:-$(( MINUTES * 60 - 60 ))}
if [ "$INNER" -lt 60 ]; then
  echo "gpu_job.sh: --minutes $MINUTES leaves no time to run (at least 2)" >&2
  exit 2
fi
BUDGET=$(awk -v s="$INNER" 'BEGIN { printf "%.2f", (s - 30) / 60 }')
echo "gpu_job.sh: ${MINUTES} min: suite budget ${BUDGET} min, inner limit ${INNER} s, bundle ${BUNDLE}"
timeout --preserve-status --signal=INT --kill-after=20 "$INNER" \
  "$PYTHON" -m osfl suite run --budget "$BUDGET" --out "$SUITE_OUT" --bundle "$BUNDLE" \
  --pack "$PACK" "${ARGS[@]}" 2>&1 | tee "$SUITE_OUT/job.log"
RC=${PIPESTATUS[0]}

# 3. the job's own log beside the bundle (its last 4 MiB); the suite wrote the
#    rest after every finished step
tail -c 4194304 "$SUITE_OUT/job.log" >"$BUNDLE/job.log"
echo "gpu_job.sh: osfl suite run exited $RC; bundle:"
ls -l "$BUNDLE"
exit "$RC"
