"""A generative judge as a reward term: a model named in the config reads (prompt, response,
reference) through a template and answers with a verdict that is parsed into [0, 1].

The judge runs on the rollout engines (``hf`` or ``vllm`` in a child process of its own by
default, so a stuck or dead judge can be killed and started again without touching the run)
or on a judge server (``engine: sglang``: SGLang, sglang-router or ``megatron-rl serve`` at
``urls``, the API key from ``$MEGATRON_RL_API_KEY`` or ``api_key_file``; a client that only
generates, :mod:`.judge_client`, never pushes weights to it) and scores a step's samples in one
batched call, greedy; ``model`` gives its tokenizer then (and, locally, its weights). Its
score enters a sample's reward as ``rewards.judge.weight x verdict`` for the domains its
``domains`` patterns select, on top of the verifier's terms (a domain without a checker gives
its verifier ``outcome: 0``).

A verdict that cannot be had never becomes a silent 0: the sample is counted under
``judge/failures/<kind>`` and its group is dropped from training, like a group whose
verification failed. Kinds:

* ``empty``: the judge answered nothing;
* ``unparsable``: no score in the answer (``parse: score``: the first number, divided by
  ``scale`` and kept only in [0, 1]) or no listed choice (``parse: choice``: the first word of
  ``choices`` found, case-insensitive);
* ``timeout``: the batch, start-up of the judge included, took longer than ``timeout_s`` (plus
  ``start_timeout_s`` when it started the judge): the judge process is killed and a new one
  started for the next batch;
* ``dead``: the judge's engine raised, its process died or its server cannot be reached
  (started again for the next batch). A judge that cannot be started is retried with back-off:
  the batches in between are counted ``dead`` at once (:mod:`megatron_rl.rewards.service`), and
  the run goes on.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from megatron_rl.domains.base import Task
from megatron_rl.rewards.service import Deadlined

TEMPLATE = (
    "Question: {prompt}\nReference answer: {gold}\nResponse: {response}\n"
    "Rate the response from 0 to 10. Score:"
)
FAILURES = ("empty", "unparsable", "timeout", "dead")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass
class JudgeConfig:
    """``rewards.judge``: the judge model and how its verdict becomes a reward."""

    model: str = ""  # HF-layout checkpoint of the judge ("": no judge); not tied to the policy
    engine: str = "hf"  # a rollout engine: hf, vllm (own process), sglang (a judge server)
    urls: list[str] = field(default_factory=list)  # engine sglang: http(s) URLs of the judge
    # server or its router; the first that answers is used
    api_key_file: str = ""  # engine sglang: file with the judge server's API key
    # ($MEGATRON_RL_API_KEY wins; "": none but the environment's; rollout/auth.py)
    template: str = TEMPLATE  # fields {prompt}, {response}, {gold}
    parse: str = "score"  # 'score': first number / scale in [0, 1]; 'choice': see choices
    scale: float = 10.0  # score parse: the verdict's full mark
    choices: dict[str, float] = field(default_factory=dict)  # choice parse: word -> reward
    max_tokens: int = 8  # verdict tokens the judge may write
    timeout_s: float = 60.0  # one batched judge call, seconds, start-up of the judge included
    start_timeout_s: float = 0.0  # extra seconds for a batch that starts the judge (model load)
    weight: float = 1.0  # reward += weight x verdict (on the judged domains)
    replace: bool = False  # its weighted score is the reward on its domains, instead of the
    # verifier's terms (a constraint's price still applies; held-out accuracy stays the verifier's)
    domains: list[str] = field(default_factory=list)  # names or globs the judge scores

    def validate(self) -> None:
        if self.parse not in ("score", "choice"):
            raise ValueError(f"rewards.judge.parse={self.parse!r}: choose 'score' or 'choice'")
        if self.parse == "choice" and not self.choices:
            raise ValueError(
                "rewards.judge.parse=choice needs rewards.judge.choices (word -> reward)"
            )
        if self.scale <= 0 or self.timeout_s <= 0 or self.max_tokens < 1:
            raise ValueError(
                f"rewards.judge: scale and timeout_s must be > 0 and max_tokens >= 1, got "
                f"{self.scale}, {self.timeout_s}, {self.max_tokens}"
            )
        if self.start_timeout_s < 0:
            raise ValueError(
                f"rewards.judge.start_timeout_s must be >= 0, got {self.start_timeout_s}"
            )
        self._validate_urls()
        if self.model and not self.domains:
            raise ValueError("rewards.judge.model is set but rewards.judge.domains selects none")
        for k in ("{response}",):
            if k not in self.template:
                raise ValueError(f"rewards.judge.template must contain {k}")

    def _validate_urls(self) -> None:
        from urllib.parse import urlsplit

        if self.engine != "sglang":
            if self.urls:
                raise ValueError(
                    f"rewards.judge.urls is set but rewards.judge.engine={self.engine!r}: the "
                    "URLs are a judge server's, for engine sglang"
                )
            return
        if not self.urls:
            raise ValueError(
                "rewards.judge.engine=sglang needs rewards.judge.urls=[http://HOST:PORT] (the "
                "judge server or its router)"
            )
        for i, url in enumerate(self.urls):
            try:
                parts = urlsplit(url)
                ok = parts.scheme in ("http", "https") and bool(parts.hostname)
                ok = ok and (parts.port or 1) > 0  # a port that is not a number raises
            except (TypeError, ValueError, AttributeError):
                ok = False
            if not ok:
                raise ValueError(
                    f"rewards.judge.urls[{i}]={url!r}: not an http(s) URL (http://HOST:PORT)"
                )


def parse_verdict(text: str, cfg: JudgeConfig) -> float | str:
    """The verdict's reward in [0, 1], or the failure kind ('empty' / 'unparsable')."""
    text = text.strip()
    if not text:
        return "empty"
    if cfg.parse == "score":
        m = _NUMBER.search(text)
        if m is None:
            return "unparsable"
        value = float(m.group()) / cfg.scale
        return value if 0.0 <= value <= 1.0 else "unparsable"
    low = text.lower()
    hits = [(low.find(w.lower()), w) for w in cfg.choices if w.lower() in low]
    return float(cfg.choices[min(hits)[1]]) if hits else "unparsable"


class Judge(Deadlined):
    """Scores (task, response) pairs in one batched call per step (see the module docstring).
    ``make_engine``: how to start the judge's engine (tests pass hostile ones)."""

    kinds = FAILURES
    prefix = "judge"

    def __init__(
        self,
        cfg: JudgeConfig,
        seed: int,
        make_engine: Callable[[], Any] | None = None,
        tokenizer: Any = None,
    ) -> None:
        make = make_engine or self._default_engine
        super().__init__(make, cfg.timeout_s, cfg.domains, cfg.start_timeout_s)
        self.cfg, self.seed = cfg, seed
        if tokenizer is None:  # the judge's own: it need not be the policy's
            from megatron_rl.model.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(cfg.model)
        self.tokenizer = tokenizer

    def _default_engine(self) -> Any:
        """A judge server's client (engine sglang), else the engine in a child process."""
        from megatron_rl.rollout.build import build_engine
        from megatron_rl.rollout.config import RolloutConfig, SGLangConfig

        if self.cfg.engine == "sglang":
            from megatron_rl.rewards.judge_client import JudgeClient

            rc = RolloutConfig(
                engine="sglang",
                urls=list(self.cfg.urls),
                max_new_tokens=self.cfg.max_tokens,
                request_timeout_s=self.cfg.timeout_s,  # no request outlives its batch
                sglang=SGLangConfig(api_key_file=self.cfg.api_key_file),
            )
            return JudgeClient(rc)
        rc = RolloutConfig(
            engine=self.cfg.engine, process="own", max_new_tokens=self.cfg.max_tokens
        )
        return build_engine(rc, self.cfg.model, self.seed)

    def score(self, items: list[tuple[Task, str]]) -> list[float | str]:
        """Per item its reward in [0, 1] or its failure kind; counts both."""
        if not items:
            return []
        from megatron_rl.model.tokenizer import prompt_ids
        from megatron_rl.rollout.base import GenRequest, SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=self.cfg.max_tokens, n=1, seed=0)

        def call(engine: Any) -> list[Any]:
            reqs = [
                GenRequest(prompt_ids(self.tokenizer, self._prompt(t, r)), params) for t, r in items
            ]
            out: list[Any] = engine.generate(reqs)
            return out

        outs = self.run(len(items), call)
        if isinstance(outs, str):
            return [outs] * len(items)
        verdicts = [parse_verdict(o[0].text if o else "", self.cfg) for o in outs]
        self.count(verdicts)
        return verdicts

    def _prompt(self, task: Task, response: str) -> str:
        return self.cfg.template.format(prompt=task.prompt, response=response, gold=task.gold)
