"""The sampler interface: token ids in, token ids + logprobs out.

Every backend (vLLM, JAX) implements :class:`Sampler`. Prompts are token ids, never
text; the returned ``token_ids`` are exactly what was sampled and ``logprobs[i]`` is the
log-probability of ``token_ids[i]`` under the sampling distribution at temperature T,
``log_softmax(logits / T)[token]``, so the trainer can compare its own logprobs.
With top-p / top-k truncation active (``top_p < 1`` or ``top_k > 0``) it is the logprob
under the truncated, renormalised distribution the token was actually drawn from
(vLLM's ``processed_logprobs``; the JAX sampler does the same), which equals the
trainer's value whenever truncation is off (the RL default). Greedy decoding
(``temperature == 0``) reports ``log_softmax(logits)`` (T taken as 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from verltool_jax.truncation import TOP_K_OFF, TOP_P_OFF

# Partial rollouts (``rollout.partial_rollouts``; docs/rollout.md): off by default, so a
# request in flight at a weight sync goes on as before and is labelled with the version
# it started on. The one default the rollout config and the sampler constructors share.
PARTIAL_ROLLOUTS_DEFAULT = False


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = TOP_P_OFF
    top_k: int = TOP_K_OFF  # -1: disabled
    stop: tuple[str, ...] = ()  # stop strings, kept in the output
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be -1 (off) or >= 1, got {self.top_k}")
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError("SamplingParams.stop must be a tuple of non-empty strings")
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            raise ValueError("SamplingParams.stop_token_ids must be non-negative ints")


@dataclass
class Completion:
    """One sampled turn. ``policy_version`` is the version of the first token (the oldest);
    ``token_versions``, when set (a partial rollout continued across a weight sync), is the
    version that sampled each token, the same length as ``token_ids``; None: every token
    is ``policy_version``'s (:meth:`versions` gives the per-token list either way)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (stop string / stop id / EOS) or "length"
    stop_string: str | None = None  # the stop string that ended it, if any
    policy_version: int = 0  # weights version of the first (oldest) token
    metrics: dict = field(default_factory=dict)
    token_versions: list[int] | None = None

    def versions(self) -> list[int]:
        """The policy version that sampled each of ``token_ids``."""
        if self.token_versions is None:
            return [int(self.policy_version)] * len(self.token_ids)
        if len(self.token_versions) != len(self.token_ids):
            raise ValueError(
                f"Completion.token_versions has {len(self.token_versions)} entries for "
                f"{len(self.token_ids)} tokens; a sampler must give one version per token"
            )
        return [int(v) for v in self.token_versions]


class SamplerError(RuntimeError):
    """A sampler failed (bad request, dead engine); the message says what to do."""


class SamplerRequestError(SamplerError, ValueError):
    """The request itself is invalid (prompt too long, unknown stop token id, ...)."""


class SamplerDeadError(SamplerError):
    """The backend engine died and could not be (or was not allowed to be) restarted."""


class SamplerTimeoutError(SamplerError):
    """A request did not finish within the sampler's ``request_timeout_s``."""


@runtime_checkable
class Sampler(Protocol):
    version: int

    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        *,
        images: Sequence[Any] | None = None,
    ) -> Completion:
        """Sample one completion. ``request_id`` (e.g. the trajectory id) enables sticky
        routing. ``images`` (``models.image_inputs.ImageInput``, one per placeholder run of
        the prompt) are for vision-language policies; a backend or model that cannot take
        them raises :class:`SamplerRequestError`."""
        ...

    def update_weights(self, params: Any, version: int) -> None:
        """Install new policy weights (Flax params pytree of the policy) as ``version``."""
        ...

    def close(self) -> None: ...
