"""An example OpenEnv environment: guess a number from 1 to 10 in at most 4 tries.

The number is fixed by the reset seed; every guess is answered "higher", "lower" or
"right" (reward 1, done); the episode ends after 4 guesses. Served by OpenEnv's own
server (``openenv-core``, the ``openenv`` extra)::

    python examples/openenv_env/guess_number.py --port 8000

and trained on through the ``openenv`` task, tool and reward (docs/environments.md),
e.g. by ``experiments/envs_smollm2.py --env openenv``.
"""

from __future__ import annotations

import argparse
import random

from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

LOW, HIGH, MAX_GUESSES = 1, 10, 4


class GuessAction(Action):
    message: str  # the guess, as the model wrote it


class GuessObservation(Observation):
    prompt: str = ""


class GuessState(State):
    number: int = 0


def number_of(seed: int) -> int:
    """The episode's number for reset seed ``seed``."""
    return random.Random(seed).randint(LOW, HIGH)


class GuessNumberEnv(Environment[GuessAction, GuessObservation, GuessState]):
    """Reward 1 for the right number within ``MAX_GUESSES`` guesses, else 0."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = GuessState()

    def reset(self, seed=None, episode_id=None, **kwargs) -> GuessObservation:
        self._state = GuessState(episode_id=episode_id, number=number_of(seed or 0))
        return GuessObservation(
            prompt=f"I am thinking of a number from {LOW} to {HIGH}. You have "
            f"{MAX_GUESSES} guesses."
        )

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
        self._state.step_count += 1
        out_of_guesses = self._state.step_count >= MAX_GUESSES
        try:
            guess = int(action.message.strip())
        except ValueError:
            return GuessObservation(
                prompt=f"not a whole number: {action.message.strip()[:40]!r}",
                reward=0.0,
                done=out_of_guesses,
            )
        right = guess == self._state.number
        said = "right" if right else ("higher" if guess < self._state.number else "lower")
        return GuessObservation(prompt=said, reward=float(right), done=right or out_of_guesses)

    @property
    def state(self) -> GuessState:
        return self._state


def app(max_sessions: int = 64):
    """The FastAPI app (OpenEnv's ``create_fastapi_app``)."""
    return create_fastapi_app(GuessNumberEnv, GuessAction, GuessObservation, max_sessions)


if __name__ == "__main__":
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-sessions", type=int, default=64)
    a = ap.parse_args()
    uvicorn.run(app(a.max_sessions), host=a.host, port=a.port, ws="websockets-sansio")
