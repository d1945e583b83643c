"""Every metric name the project logs, in one place: the trainer, the queue, the health
monitor and the evaluator log under these names; the progress line, the plots, the
run-directory reader and the sweep reports read them back.

Fixed names are constants below. Three families are built from a prefix:

- the batch summary (``reporting.batch_summary.summarize(trajs, prefix)``):
  ``{prefix}/reward``, ``/acc``, ``/tool_calls``, ``/invalid_tool_calls``, ``/turns``,
  ``/response_len``, ``/num``, ``/term_{reason}``, ``/reward_timeouts``,
  ``/reward_errors``, ``/no_answer`` and the judge's ``/judge_*``, with prefix
  ``rollout`` (each step) or ``eval`` (held-out evaluation);
- the train step's own metrics, ``train/{name}`` (``train/metrics.train_once``: loss,
  clip fractions, KL, entropy, grad norm, as the loss returns them);
- time spent per phase of a step, ``time/{phase}_s`` (``train/metrics.StepTimer``).
"""

STEP = "step"

# the step's trajectories (train/metrics.rollout_metrics)
REWARD = "reward/mean"  # mean shaped reward of the step's trajectories
ACC = "acc/mean"  # fraction of the step's trajectories judged correct
STALENESS = "rollout/staleness_mean"  # mean policy lag of a step's trajectories
ROLLOUT_ERRORS = "rollout/errors"  # trajectories that ended in an error
OVERLONG_PENALTY = "reward/overlong_penalty"  # DAPO's mean overlong penalty
CURIOSITY_BONUS = "reward/curiosity_bonus"  # visual family's mean bonus for a first image call
EXTRA_CALL_PENALTY = "reward/extra_call_penalty"  # visual family's mean penalty for extra calls

# held-out evaluation (train/evaluate.py)
EVAL_ACC = "eval/acc"  # held-out accuracy (greedy or sampled, per config)
EVAL_FAILED = "eval/failed"  # evaluation trajectories lost to a dependency failure

# the batch that was trained (train/batch.py, the trainer)
BATCH_SIZE = "batch/size"  # trajectories in the batch
BATCH_SEQ_LEN = "batch/seq_len"  # padded length
BATCH_ADV_ABS_MEAN = "batch/adv_abs_mean"  # mean |advantage|
BATCH_OBS_TOKENS = "batch/observation_tokens_trained"  # observation tokens inside the loss mask (0)
BATCH_SHARED_PROMPT = "batch/shared_prompt"  # 1: the shared-prompt layout (trainer.shared_prompt)
BATCH_INFORMATIVE_FRAC = "batch/informative_frac"  # kept by the dynamic-sampling filter
BATCH_UNINFORMATIVE = "batch/uninformative_batches"  # batches skipped as having no signal

# learning signal (reporting/learning_signal.py)
NO_SIGNAL_FRAC = "signal/no_signal_frac"  # groups whose rewards are all equal / groups
SIGNAL_GROUPS = "signal/groups"  # groups in the batch
SIGNAL_ZERO_GROUPS = "signal/zero_groups"  # groups that all failed
SIGNAL_SOLVED_GROUPS = "signal/solved_groups"  # groups that all succeeded
SIGNAL_NONZERO_ADV = "signal/nonzero_adv"  # trajectories with a non-zero advantage
PASS_RATE_0 = "signal/pass_rate_0"  # fraction of groups with pass rate 0 (histogram bins
PASS_RATE_100 = "signal/pass_rate_100"  # signal/pass_rate_{0,25,50,75,100} in between)

# sampler/trainer mismatch of the sampled tokens, keys of the train step's metrics (logged
# as train/<key>; algos/offpolicy.mismatch_metrics)
TRAIN_MISMATCH_KL_K3 = "offpolicy_kl_k3"  # k3 estimate of KL(sampler || trainer)
TRAIN_MISMATCH_KL_K1 = "offpolicy_kl_k1"  # k1 (plain) estimate of the same KL
TRAIN_OFFPOLICY_MASKED_FRAC = "offpolicy_masked_frac"  # loss-mask tokens given weight 0
TRAIN_MISMATCH_RATIO_MAX = "offpolicy_ratio_max"  # largest p_trainer / p_sampler of a token
TRAIN_TIS_WEIGHT_MEAN = "tis_weight_mean"  # mean off-policy weight (algos.policy_loss)
# the parity sums the train step returns when its batch has a parity_mask (train/parity.py);
# the trainer turns them into the sync/ parity metric below and does not log them
TRAIN_PARITY_ABS_SUM = "parity_abs_sum"
TRAIN_PARITY_ABS_MAX = "parity_abs_max"
TRAIN_PARITY_TOKENS = "parity_tokens"

# wall time (train/metrics.StepTimer and the trainer)
TIME_STEP = "time/step_s"
TIME_ROLLOUT_WAIT = "time/rollout_wait_s"  # trainer blocked waiting for groups
TIME_TRAIN = "time/train_s"  # the train step(s)
TIME_SYNC = "time/sync_s"  # pushing weights to the samplers
TIME_PARITY = "time/parity_s"  # the sampler-vs-trainer log-prob pass
TIME_BATCH = "time/batch_s"  # building the batch
TIME_REWARD = "time/reward_s"  # scoring the groups
TIME_EVAL = "time/eval_s"  # a held-out evaluation
TOKENS_PER_S = "perf/tokens_per_s"  # sampled (loss-mask) tokens of the step per wall second

# weight sync and sampler/trainer parity (train/metrics.py, train/parity.py)
SYNC_BYTES = "weight_sync/bytes"  # payload bytes of the last push (per engine)
SYNC_SECONDS = "weight_sync/seconds"  # wall seconds of the last push (all engines)
SYNC_GBPS = "weight_sync/gb_per_s"  # SYNC_BYTES / SYNC_SECONDS / 1e9
SYNC_ADAPTER_ONLY = "weight_sync/adapter_only"  # 1: the last push carried LoRA adapters only
PARITY_DIFF_MEAN = "sync/logprob_diff_mean"  # mean |sampler - trainer| log-prob
PARITY_DIFF_MAX = "sync/logprob_diff_max"
PARITY_TOKENS = "sync/parity_tokens"  # tokens compared

# the trajectory queue (rollout/queue.py)
QUEUE_GROUPS_IN = "queue/groups_in"
QUEUE_GROUPS_OUT = "queue/groups_out"
QUEUE_DROPPED_STALE = "queue/dropped_stale"  # cumulative count of groups dropped as too stale
QUEUE_RELEASED = "queue/released"  # groups taken without an update (slots freed)
QUEUE_DEPTH = "queue/depth"
QUEUE_MAX_DEPTH = "queue/max_depth"
QUEUE_PUT_WAIT = "queue/put_wait_s"
QUEUE_GET_WAIT = "queue/get_wait_s"
QUEUE_ADMIT_WAIT = "queue/admit_wait_s"
QUEUE_STALENESS_MEAN = "queue/staleness_mean"
QUEUE_STALENESS_MAX = "queue/staleness_max"

# dependency health (train/health.py)
HEALTH_SKIPPED_STEPS = "health/skipped_steps"
HEALTH_TOOL_SERVER_RESTARTS = "health/tool_server_restarts"
HEALTH_SAMPLER_RESTARTS = "health/sampler_restarts"
HEALTH_REWARD_POOL_RESTARTS = "health/reward_pool_restarts"
