"""Metric names shared by the trainer (which logs them), the progress line and the plots."""

STEP = "step"
REWARD = "reward/mean"  # mean shaped reward of the step's trajectories
ACC = "acc/mean"  # fraction of the step's trajectories judged correct
EVAL_ACC = "eval/acc"  # held-out accuracy (greedy or sampled, per config)
TOKENS_PER_S = "perf/tokens_per_s"  # sampled + trained tokens per wall second
TIME_ROLLOUT_WAIT = "time/rollout_wait_s"  # trainer blocked waiting for groups
TIME_TRAIN = "time/train_s"  # the train step(s)
TIME_SYNC = "time/sync_s"  # pushing weights to the samplers
SYNC_BYTES = "weight_sync/bytes"  # payload bytes of the last push (per engine)
SYNC_SECONDS = "weight_sync/seconds"  # wall seconds of the last push (all engines)
SYNC_GBPS = "weight_sync/gb_per_s"  # SYNC_BYTES / SYNC_SECONDS / 1e9
TIME_STEP = "time/step_s"
NO_SIGNAL_FRAC = "signal/no_signal_frac"  # groups whose rewards are all equal / groups
