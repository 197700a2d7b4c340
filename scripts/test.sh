#!/usr/bin/env bash
# `make test`: set-up, the whole suite on the current stack (.venv), then the suite's Colab part on
# Colab's pins (.venv-colab), then the account (time per step and tier, slowest tests, clusters).
#
# Steps run side by side where that was measured safe on 2 cores (tests/README.md):
# - the main suite, after P10's timing check alone, as two sessions: its engine tests (mostly
#   waiting for processes to start and be noticed) beside the rest (fast, kernel, notebook and
#   browser tiers); .venv-colab and .venv-colab-tpu are set up beside both (mostly download and
#   unpacking; test-output/setup-colab*.log); the engine tests' output is test-output/engines.log.
# - the long tier (the fault matrix and the soaks, which mostly wait for processes to start, die
#   and be noticed: 42% of 2 cores alone) runs beside the docs, the Colab part and then the Ray
#   tier (a Ray head of its own), in a pytest session with its own account; its output follows
#   the Ray tier's in the log (test-output/long.log). A third session beside both runs the tiers that hold fixed names
#   (network namespaces, the Slurm cluster: marker netns, Slurm's tests included) and the pip
#   dry runs against Colab's and Kaggle's pins (stacks), then the TPU-runtime part.
#
#   PYTEST_ARGS   extra pytest arguments for both suites (CI passes -p no:cacheprovider)
#   COLAB_TESTS   the marker expression of the Colab part (the Makefile sets it)
set -uo pipefail
cd "$(dirname "$0")/.."
: "${COLAB_TESTS:?the marker expression of the Colab part (make test sets it: see the Makefile)}"
OUT=${KDIST_TEST_OUTPUT:-test-output}
mkdir -p "$OUT/colab" "$OUT/colab-tpu"
STEPS="$OUT/steps.tsv"
: > "$STEPS"
status=0
# every process this run starts carries it (tests/leftovers.py's last look counts only those:
# another user's kdist, or another make test beside this one, is not this run's)
export KDIST_TEST_RUN="make-test-$$-$(date +%s)"

step() {  # step NAME COMMAND...: run it, record its time and exit status
  local name=$1 start rc
  shift
  start=$(date +%s)
  "$@"
  rc=$?
  printf '%s\t%s\t%s\n' "$name" "$(( $(date +%s) - start ))" "$rc" >> "$STEPS"
  return $rc
}

# Ctrl-C or a CI timeout: end the steps running in the background too, whole process trees
kill_tree() {
  local child
  for child in $(pgrep -P "$1"); do kill_tree "$child"; done
  kill "$1" 2>/dev/null
}
trap 'for job in $(jobs -p); do kill_tree "$job"; done; exit 130' INT TERM

step "set-up .venv" env KDIST_REQUIRE_HOROVOD=1 bash scripts/setup.sh --browser --torch --ray || {
  python3 scripts/test_account.py "$STEPS"; exit 1; }

# The main suite: what .venv runs of the suite but for the sessions below. First P10's timing
# check, alone (a prediction against a measured step: beside other sessions a rank's compute
# felt their load at 2 ranks and not at 1, rehearsal 13); then two halves side by side, the
# engine tests (mostly waiting for processes: ~55% of 2 cores alone) beside the rest (fast,
# kernel, notebook and browser tiers), each its own pytest session and account; the engines'
# half's output follows in the log (test-output/engines.log).
MAIN="not classic and not docs and not long and not ray and not netns and not tfless and not stacks"
ENGINES_HALF="engines and not notf"
# shellcheck disable=SC2086
step "suite in .venv: P10's timing check, alone" env KDIST_ACCOUNT=account-p10 .venv/bin/python -m pytest -m "$MAIN" \
  tests/test_scale_netns.py ${PYTEST_ARGS:-} || status=1
# both Colab environments, one after the other, beside the main suite (mostly download and
# unpacking, ~1 minute each with a warm cache); each one's exit status in a file for later
( step "set-up .venv-colab (beside the suite)" bash scripts/setup.sh --env colab \
    > "$OUT/setup-colab.log" 2>&1
  echo $? > "$OUT/setup-colab.rc"
  step "set-up .venv-colab-tpu (beside the suite)" bash scripts/setup.sh --env colab-tpu \
    > "$OUT/setup-colab-tpu.log" 2>&1
  echo $? > "$OUT/setup-colab-tpu.rc" ) &
setups=$!

# shellcheck disable=SC2086
( step "suite in .venv: its engine tests (beside the rest)" env KDIST_ACCOUNT=account-engines \
    .venv/bin/python -m pytest -m "($MAIN) and ($ENGINES_HALF)" --deselect tests/test_scale_netns.py \
    ${PYTEST_ARGS:-} > "$OUT/engines.log" 2>&1 ) &
engines=$!
# shellcheck disable=SC2086
step "suite in .venv: the rest (beside its engine tests)" .venv/bin/python -m pytest \
  -m "($MAIN) and not ($ENGINES_HALF)" --deselect tests/test_scale_netns.py ${PYTEST_ARGS:-} || status=1
wait $engines || status=1
echo "=== the main suite's engine tests, which ran beside the rest ($OUT/engines.log) ==="
cat "$OUT/engines.log"

wait $setups
cat "$OUT/setup-colab.log" "$OUT/setup-colab-tpu.log"
ready() { [ "$(cat "$OUT/setup-$1.rc" 2>/dev/null)" = 0 ]; }

# the long tier in a session of its own beside the Colab part and the Ray tier (rehearsal 28: the
# long and Ray tiers in one session took ~1700 s where the Colab part's took ~950 s)
# shellcheck disable=SC2086
( step "long tier in .venv (beside the Colab part and the Ray tier)" env KDIST_ACCOUNT=account-long \
    .venv/bin/python -m pytest -m "long and not ray and not netns" ${PYTEST_ARGS:-} > "$OUT/long.log" 2>&1 ) &
long=$!
# the network-namespace and Slurm tiers (a Slurm job at its time limit among them: 100 s, nearly
# all waiting for slurmctld) in a third session: they hold fixed names, so only here, in turn;
# then, in the same session, Colab's TPU runtime: its pins, no TensorFlow (.venv-colab-tpu), the
# tests that need none (marker notf); Keras on JAX, as a user there sets it
# shellcheck disable=SC2086
( step "netns and Slurm in .venv (beside both)" env KDIST_ACCOUNT=account-netns \
    .venv/bin/python -m pytest -m "netns or stacks" ${PYTEST_ARGS:-} > "$OUT/netns.log" 2>&1
  rc=$?
  if ready colab-tpu; then
    step "TPU-runtime part in .venv-colab-tpu (no TensorFlow)" env KERAS_BACKEND=jax \
      KDIST_TEST_OUTPUT="$OUT/colab-tpu" .venv-colab-tpu/bin/python -m pytest -m notf \
      ${PYTEST_ARGS:-} >> "$OUT/netns.log" 2>&1 || rc=1
  else
    echo "make test: setting up .venv-colab-tpu failed (log above); its part did not run" >> "$OUT/netns.log"
    rc=1
  fi
  exit $rc ) &
limit=$!

# the docs site, once the main suite has executed the notebooks its tutorials show (~30 s),
# then the suite's Colab part, both beside the two sessions above
# shellcheck disable=SC2086
step "docs in .venv (before the Colab part)" env KDIST_ACCOUNT=account-docs \
  .venv/bin/python -m pytest -m docs ${PYTEST_ARGS:-} || status=1
if ready colab; then
  # shellcheck disable=SC2086
  step "Colab part in .venv-colab (beside the long tier)" env KDIST_TEST_OUTPUT="$OUT/colab" \
    .venv-colab/bin/python -m pytest -m "$COLAB_TESTS" ${PYTEST_ARGS:-} || status=1
else
  echo "make test: setting up .venv-colab failed (log above); its part of the suite did not run" >&2
  status=1
fi
# then the Ray tier in .venv (a Ray head of its own, started and stopped by tests/test_ray.py)
# shellcheck disable=SC2086
step "Ray tier in .venv (after the Colab part, beside the long tier)" env KDIST_ACCOUNT=account-ray \
  .venv/bin/python -m pytest -m "ray and not netns" ${PYTEST_ARGS:-} || status=1
wait $long || status=1
echo "=== the long tier in .venv, which ran beside the Colab part ($OUT/long.log) ==="
cat "$OUT/long.log"
wait $limit || status=1
echo "=== the netns and Slurm tiers in .venv, then the TPU-runtime part in .venv-colab-tpu, which ran beside both ($OUT/netns.log) ==="
cat "$OUT/netns.log"

# Nothing kdist started outlives the suite: each session checked its own (tests/leftovers.py);
# this looks once more, from outside, after every session has ended: every kind of process kdist
# starts (kdist_magics.cluster.lifetime.STARTED), of this run only, after the same grace.
if left=$(.venv/bin/python tests/leftovers.py); then
  echo "make test: no process kdist started is left"
else
  echo "make test: processes kdist started are still running after the suite:" >&2
  echo "$left" >&2
  status=1
fi

.venv/bin/python scripts/test_account.py "$STEPS" "$OUT/account-p10.json" "$OUT/account.json" \
  "$OUT/account-engines.json" "$OUT/account-docs.json" "$OUT/account-ray.json" \
  "$OUT/account-long.json" "$OUT/account-netns.json" "$OUT/colab/account.json" \
  "$OUT/colab-tpu/account.json"
exit $status
