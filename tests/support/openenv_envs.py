"""A small OpenEnv environment for the tests (served with OpenEnv's own server): say the
episode's word, fixed by the reset seed."""

from __future__ import annotations

from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class WordAction(Action):
    message: str


class WordObservation(Observation):
    prompt: str = ""


class WordState(State):
    target: str = ""


def target_of(seed: int) -> str:
    return f"w{seed * 7 % 10}"


class WordEnv(Environment[WordAction, WordObservation, WordState]):
    """Say the episode's word (fixed by the reset seed): reward 1 and done when said,
    0 otherwise; at most 3 steps."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = WordState()

    def reset(self, seed=None, episode_id=None, **kwargs) -> WordObservation:
        self._state = WordState(episode_id=episode_id, target=target_of(seed or 0))
        return WordObservation(prompt=f"Say the word {self._state.target}.")

    def step(self, action: WordAction, timeout_s=None, **kwargs) -> WordObservation:
        self._state.step_count += 1
        ok = action.message.strip() == self._state.target
        return WordObservation(
            prompt="right" if ok else "wrong, try again",
            reward=1.0 if ok else 0.0,
            done=ok or self._state.step_count >= 3,
        )

    @property
    def state(self) -> WordState:
        return self._state


def word_env_app(max_sessions: int = 16):
    """The FastAPI app of :class:`WordEnv` (OpenEnv's ``create_fastapi_app``)."""
    return create_fastapi_app(WordEnv, WordAction, WordObservation, max_sessions)
