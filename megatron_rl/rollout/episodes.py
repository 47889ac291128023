"""Multi-turn episodes: the model acts, the domain's environment answers, until done.

All active episodes of a step advance together, one engine call per turn. The transcript is
rendered with the tokenizer's chat template; each sample's response is every token after the
first prompt: model turns (trained, with the engine's log-probs) interleaved with environment
turns (template + observation tokens, ``response_mask`` 0, so the trainer masks them out of the
loss). The verifier sees the last model turn (see ``domains/tool_use.py`` for the format).
An episode ends ``stop`` when the environment says done, ``length`` (truncated, so
``rewards.truncated_reward`` applies) when a model turn hits ``max_tokens`` or the episode hits
``MAX_EPISODE_TURNS`` without the environment finishing. The controller runs them in training
(``controller/generate.py``) and evaluation runs the same episodes, greedily
(``evaluation/evaluate.py``), so they live here, below both.
"""

from __future__ import annotations

from typing import Any

from megatron_rl.domains import Domain
from megatron_rl.model.tokenizer import prompt_ids, render_chat
from megatron_rl.rollout.base import GenRequest, RolloutEngine, SamplingParams
from megatron_rl.rollout.groups import Group, Sample

MAX_EPISODE_TURNS = 8  # hard cap on model turns; an episode cut off by it is truncated


class _Episode:
    def __init__(self, domain: Domain, group: Group, tokenizer: Any) -> None:
        self.env = domain.env(group.task)
        self.messages: list[dict[str, str]] = [{"role": "user", "content": group.task.prompt}]
        self.prompt = prompt_ids(tokenizer, group.task.prompt)
        self.ids = list(self.prompt)
        self.response_ids: list[int] = []
        self.logprobs: list[float] = []
        self.mask: list[float] = []
        self.last_turn = ""
        self.finish = "stop"
        self.done = False
        self.turns = 0
        self.routed_experts: Any = None  # the last turn's: it covers the whole transcript

    def add_model_turn(self, c: Any) -> None:
        """Append a model turn (an engine :class:`Completion`)."""
        self.ids += c.token_ids
        self.response_ids += c.token_ids
        self.logprobs += c.logprobs
        self.mask += [1.0] * len(c.token_ids)
        self.messages.append({"role": "assistant", "content": c.text})
        self.last_turn = c.text
        self.turns += 1
        self.routed_experts = c.routed_experts

    def add_env_turn(self, tokenizer: Any, observation: str) -> None:
        before = render_chat(tokenizer, self.messages, add_generation_prompt=False)
        self.messages.append({"role": "tool", "content": observation})
        after = render_chat(tokenizer, self.messages, add_generation_prompt=True)
        if not after.startswith(before):
            raise ValueError("chat template is not prefix-stable; multi-turn episodes need it")
        extra = list(tokenizer.encode(after[len(before) :], add_special_tokens=False))
        self.ids += extra
        self.response_ids += extra
        self.logprobs += [0.0] * len(extra)
        self.mask += [0.0] * len(extra)


def run_episodes(
    engine: RolloutEngine,
    tokenizer: Any,
    domains: dict[str, Domain],
    groups: list[Group],
    n: int,
    max_tokens: int,
    top_p: float,
    stop: list[str] | None = None,
    limit: int | None = None,
) -> None:
    """Run ``n`` episodes per group and fill ``group.samples`` (in place). ``limit``: the
    longest transcript (tokens) a model turn may start from (the context minus ``max_tokens``);
    an episode that outgrows it ends truncated (``length``) instead of reaching the engine."""
    episodes = {
        id(g): [_Episode(domains[g.spec.domain], g, tokenizer) for _ in range(n)] for g in groups
    }
    temps = {id(g): g.spec.temperature for g in groups}
    for _ in range(MAX_EPISODE_TURNS):
        active = [(gid, e) for gid, eps in episodes.items() for e in eps if not e.done]
        for _, e in active:
            if limit is not None and len(e.ids) > limit:
                e.done, e.finish = True, "length"
        active = [(gid, e) for gid, e in active if not e.done]
        if not active:
            break
        reqs = [
            GenRequest(
                list(e.ids),
                SamplingParams(
                    temperature=temps[gid],
                    top_p=top_p,
                    max_tokens=max_tokens,
                    n=1,
                    stop=list(stop or []),
                ),
            )
            for gid, e in active
        ]
        for (_, e), outs in zip(active, engine.generate(reqs), strict=True):
            c = outs[0]
            e.add_model_turn(c)
            if c.finish_reason == "length":
                e.done, e.finish = True, "length"
                continue
            obs = e.env.step(c.text)
            if obs.done:
                e.done = True
            elif e.turns >= MAX_EPISODE_TURNS:  # the turn cap cut it off: truncated
                e.done, e.finish = True, "length"
            else:
                e.add_env_turn(tokenizer, obs.text)
    for g in groups:
        g.samples = [
            Sample(
                g.spec.domain,
                e.prompt,
                e.response_ids,
                e.logprobs,
                e.mask,
                e.last_turn,
                e.finish if e.done else "length",
                routed_experts=e.routed_experts,
            )
            for e in episodes[id(g)]
        ]
