#!/usr/bin/env bash
# One lent-GPU job, one command (issues #40, #50; docs/gpu-suite.md):
#
#   scripts/gpu_job.sh [--minutes N] [--then M] [--bundle DIR] [--dry-run] [osfl suite run options...]
#
# installs the wheels carried in gpu_pack/wheels beside the machine's own
# packages (osfl itself runs from this source tree), checks that osfl and
# every package the catalogue imports start, then runs `osfl suite run`
# (the preflight: every method once on the GPU; the rates; the plan; the
# steps in order of value) under an inner timeout INNER_MARGIN_S short of the
# command's N minutes (default 10: a lent machine's limit per command; N may
# be a decimal, e.g. 8.5), with a plan budget BUDGET_MARGIN_S shorter still,
# and writes the bundle into DIR (default $OUT, the folder a lent machine
# hands back; else runs/suite/bundle). The inner timeout sends SIGINT: the
# suite stops like on Ctrl-C, marks the step it was in (with the seconds it
# ran), and the bundle keeps every step that finished.
#
# A lease is this command and, on the same warm machine, a later one sized
# to what is left of it: --then M tells the plan that a later command of M
# minutes follows (default: what a 15-minute lease leaves, less a minute for
# the machine's start, on a fresh machine; 0 when this directory already
# holds a plan, i.e. this is the later command). Run the later one as
# `scripts/gpu_job.sh --minutes M`. Any other argument goes to
# `osfl suite run` (--sections, --steps, --dry-run, --rates, --preflight).
# A CPU dry run of this very script is tests/suite/test_job.py, which also
# holds these margins to osfl.suite.lease's.
set -uo pipefail

MINUTES=10
THEN=""
BUNDLE="${OUT:-}"
PYTHON="${PYTHON:-python3}"
PACK="${OSFL_PACK:-gpu_pack}"
SUITE_OUT="runs/suite"
INNER_MARGIN_S=45
BUDGET_MARGIN_S=15
LEASE_MINUTES=15
START_MINUTES=1
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) MINUTES="${2:-}"; shift 2 ;;
    --then) THEN="${2:-}"; shift 2 ;;
    --bundle) BUNDLE="$2"; shift 2 ;;
    --out) SUITE_OUT="$2"; shift 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
is_minutes() { awk -v m="$1" 'BEGIN { exit !(m ~ /^[0-9]+(\.[0-9]+)?$/) }'; }
if ! is_minutes "$MINUTES"; then
  echo "gpu_job.sh: --minutes takes a number of minutes (e.g. 10 or 8.5), got '$MINUTES'" >&2
  exit 2
fi
BUNDLE="${BUNDLE:-$SUITE_OUT/bundle}"
# the inner limit leaves time for the bundle, the plan's budget a little more
# (and the plan itself leaves 10 %); refused before any package is touched
INNER=${OSFL_JOB_INNER_S:-$(awk -v m="$MINUTES" -v g="$INNER_MARGIN_S" \
  'BEGIN { printf "%d", m * 60 - g }')}
if [ "$INNER" -lt 75 ]; then
  echo "gpu_job.sh: --minutes $MINUTES leaves no time to run (at least 2)" >&2
  exit 2
fi
cd "$(dirname "$0")/.." || exit 2
if [ -z "$THEN" ]; then
  if [ -f "$SUITE_OUT/plan.json" ]; then
    THEN=0  # an earlier command of this lease wrote it: this is the later one
  else
    THEN=$(awk -v l="$LEASE_MINUTES" -v s="$START_MINUTES" -v m="$MINUTES" \
      'BEGIN { t = l - s - m; if (t > 10) t = 10; if (t < 2) t = 0; printf "%g", t }')
  fi
elif ! is_minutes "$THEN"; then
  echo "gpu_job.sh: --then takes a number of minutes (0: no later command), got '$THEN'" >&2
  exit 2
fi
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
# osfl and what the catalogue imports must start before any minute is spent
# (a package missing from the pack: say which, in the bundle's log)
if ! "$PYTHON" -c "import omegaconf, datasets, flwr_datasets, osfl.cli, osfl.suite.execute" \
    >"$BUNDLE/job.log" 2>&1; then
  echo "gpu_job.sh: osfl cannot start here (a package missing from $PACK/wheels?)" \
    | tee -a "$BUNDLE/job.log" >&2
  exit 2
fi

# 2. preflight, measure, plan, run
BUDGET=$(awk -v s="$INNER" -v b="$BUDGET_MARGIN_S" 'BEGIN { printf "%.2f", (s - b) / 60 }')
echo "gpu_job.sh: ${MINUTES} min: suite budget ${BUDGET} min, inner limit ${INNER} s," \
  "later command ${THEN} min, bundle ${BUNDLE}"
timeout --preserve-status --signal=INT --kill-after=20 "$INNER" \
  "$PYTHON" -m osfl suite run --budget "$BUDGET" --then "$THEN" --out "$SUITE_OUT" \
  --bundle "$BUNDLE" --pack "$PACK" "${ARGS[@]}" 2>&1 | tee -a "$SUITE_OUT/job.log"
RC=${PIPESTATUS[0]}

# 3. the job's own log beside the bundle (its last 4 MiB); the suite wrote the
#    rest after every finished step
tail -c 4194304 "$SUITE_OUT/job.log" >"$BUNDLE/job.log"
echo "gpu_job.sh: osfl suite run exited $RC; bundle:"
ls -l "$BUNDLE"
exit "$RC"
