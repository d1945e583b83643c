"""One RL step on one page: the functions the trainer calls, in order, on a tiny random
policy. No sampler and no tool server: four trajectories are written by hand, and the
sampler's logprobs are the policy's own (what a sampler serving version 0 reports).

    python examples/one_rl_step.py

In a run, ``batch.make_batch`` does steps 2-3 (plus the DAPO options and padding) and
``step.train_on`` steps 4-5, inside ``RLLoop.rl`` (``verltool_jax/train/trainer.py``).
"""

import jax
import numpy as np
from flax import nnx

from verltool_jax.algos.advantages import compute_advantages
from verltool_jax.algos.config import algo_config
from verltool_jax.algos.optimizer import make_optimizer
from verltool_jax.models.config import ModelConfig
from verltool_jax.models.logprobs import token_logprobs
from verltool_jax.models.transformer import Transformer
from verltool_jax.rollout.trajectory import Trajectory
from verltool_jax.train.batch import PAD_MULTIPLE, batch_from_trajectories, shift_targets
from verltool_jax.train.state import TrainState
from verltool_jax.train.step import make_train_step

# 1. A tiny random policy; its train state holds params, AdamW state and the step count.
cfg = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                  head_dim=16, intermediate_size=64)  # fmt: skip
model = Transformer(cfg, nnx.Rngs(0))
algo = algo_config(adv_estimator="grpo", mini_batch_size=None, micro_batch_size=None)
optimizer = make_optimizer({"lr": 1e-2})
state = TrainState.create(model, optimizer, seed=0)

# Two prompts, two sampled responses each (a group per prompt), one right and one wrong.
rng = np.random.default_rng(0)
trajs = []
for g, prompt in enumerate([[1, 2, 3, 4], [5, 6, 7]]):
    for k, reward in enumerate([1.0, 0.0]):
        resp = rng.integers(8, 64, size=6).tolist()
        trajs.append(Trajectory(f"p{g}-{k}", f"p{g}", prompt, resp, loss_mask=[1] * 6,
                                logprobs=[0.0] * 6, versions=[0] * 6, reward=reward))  # fmt: skip
ids = batch_from_trajectories(trajs, [0.0] * 4, pad_id=0, max_len=64)["input_ids"]
lp = np.asarray(token_logprobs(model, ids, ids != 0, shift_targets(ids)))
for i, t in enumerate(trajs):  # the sampler's logprob of response token j is at p - 1 + j
    t.logprobs = lp[i, len(t.prompt_ids) - 1 :][: len(t.response_ids)].tolist()

# 2. Advantages: GRPO, (reward - group mean) / group std, one value per trajectory.
rewards, groups = [t.reward for t in trajs], [t.group_id for t in trajs]
adv = compute_advantages(algo.adv_estimator, rewards, groups)
print("advantages", np.round(adv, 3))

# 3. The batch: right-padded ids, target-aligned loss mask and behaviour logprobs.
batch = batch_from_trajectories(trajs, adv, pad_id=0, max_len=64, pad_to_multiple=PAD_MULTIPLE)
print("batch", {k: v.shape for k, v in batch.items()})

# 4. The train step (jitted): policy loss, gradient, clipped AdamW update, step + 1.
# On policy the ratio is 1 and the advantages of a group sum to 0, so the loss is 0;
# its gradient (each token's logprob gradient weighted by its advantage) is not.
train_step = make_train_step(algo, state.graphdef, optimizer, donate=False)
new_state, metrics = train_step(state, batch)
print(f"loss {float(metrics['loss']):.4f}  grad_norm {float(metrics['grad_norm']):.4f}")

# 5. One optimizer update: the params moved, and the policy is now version 1.
leaves = zip(jax.tree.leaves(state.params), jax.tree.leaves(new_state.params))
moved = max(float(np.abs(a - b).max()) for a, b in leaves)  # Adam: about lr per param
print(f"policy version {int(state.step)} -> {int(new_state.step)}; largest change {moved:.4f}")
