#!/bin/bash
# A training job's stand-in for the migration tests (tests/deployer/test_migration_live.py): counts
# steps, writes its step counter to a checkpoint on SIGUSR1 (what `--signal=B:USR1@GRACE` and
# the live loop's preemption send to the batch shell), and after a requeue resumes from the
# checkpoint. Usage: migration_job.sh DIR  (DIR/log: one line per start and checkpoint;
# DIR/counter: the current step; DIR/checkpoint: the last checkpointed step)
set -u
dir=$1
step=0
if [[ -f $dir/checkpoint ]]; then
  step=$(<"$dir/checkpoint")
fi
echo "start step=$step restart=${SLURM_RESTART_COUNT:-0} node=${SLURMD_NODENAME:-?} job=${SLURM_JOB_ID:-?}" >>"$dir/log"
checkpoint() {
  echo "$step" >"$dir/checkpoint.tmp" && mv "$dir/checkpoint.tmp" "$dir/checkpoint"
  echo "checkpoint step=$step node=${SLURMD_NODENAME:-?}" >>"$dir/log"
}
trap checkpoint USR1
while true; do
  step=$((step + 1))
  echo "$step" >"$dir/counter.tmp" && mv "$dir/counter.tmp" "$dir/counter"
  sleep 0.2 &
  wait $! || true # returns at once on a signal: the trap runs promptly
done
