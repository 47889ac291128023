"""A learned reward model as a reward term: a sequence-classification checkpoint scores each
(prompt, response), and its normalised score joins the verifier's terms.

``rewards.reward_model.model``: an HF-layout checkpoint loaded with
``AutoModelForSequenceClassification`` (one label: the score is its logit; a causal LM with a
score head, e.g. ``Qwen2ForSequenceClassification``, is one). It runs in a child process of its
own, one batched call per step (``batch_size`` sequences a forward), the text built with the
reward model's own chat template (user: the prompt, assistant: the response).

``rewards.reward_model.server``: instead, an SGLang reward server (``sglang.launch_server
--is-embedding``), its ``/classify`` endpoint with ``{"model", "text": [...]}`` answering one
``{"embedding": [score], ...}`` per text (SGLang's reward-model docs). Written against that
documented protocol and tested here against a loopback stand-in: no SGLang server has run it.

The score is normalised (``normalise``: ``sigmoid`` into (0, 1), ``batch`` a z-score over the
step's scored samples, ``none``) and enters a sample's reward as ``weight x score`` for the
domains ``domains`` selects. As with the judge (megatron_rl/rewards/service.py), a sample the
model cannot score (``timeout``, ``dead``, a non-finite score: ``invalid``) is counted under
``reward_model/failures/<kind>`` and its group is dropped from training, never scored 0. The
child's start-up (the model load) runs inside the batch's deadline, ``timeout_s`` plus
``start_timeout_s``: a start-up that fails or is late is counted and backed off from.
"""

from __future__ import annotations

import math
import multiprocessing as mp
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from megatron_rl.domains.base import Task
from megatron_rl.rewards.service import Deadlined


@dataclass
class RewardModelConfig:
    """``rewards.reward_model``: the scorer and how its score becomes a reward."""

    model: str = ""  # HF-layout sequence-classification checkpoint ("": no reward model)
    server: str = ""  # an SGLang reward server's base URL instead (unrun here)
    domains: list[str] = field(default_factory=list)  # names or globs it scores
    weight: float = 1.0  # reward += weight x normalised score
    replace: bool = False  # its weighted score is the reward on its domains, instead of the
    # verifier's terms (a constraint's price still applies; held-out accuracy stays the verifier's)
    normalise: str = "sigmoid"  # sigmoid | batch (z-score over the step) | none
    timeout_s: float = 60.0  # one batched call, seconds, start-up of the scorer included
    start_timeout_s: float = 0.0  # extra seconds for a batch that starts it (model load)
    batch_size: int = 64  # sequences per forward in the child
    threads: int = 1  # the child's torch threads

    def validate(self) -> None:
        if self.normalise not in ("sigmoid", "batch", "none"):
            raise ValueError(
                f"rewards.reward_model.normalise={self.normalise!r}: choose sigmoid, batch, none"
            )
        if (self.model or self.server) and not self.domains:
            raise ValueError(
                "rewards.reward_model is set but rewards.reward_model.domains is empty"
            )
        if self.model and self.server:
            raise ValueError("rewards.reward_model: set model or server, not both")
        if self.timeout_s <= 0 or self.batch_size < 1 or self.threads < 1:
            raise ValueError("rewards.reward_model: timeout_s > 0, batch_size and threads >= 1")
        if self.start_timeout_s < 0:
            raise ValueError(
                f"rewards.reward_model.start_timeout_s must be >= 0, got {self.start_timeout_s}"
            )


def _child(conn: Any, model_dir: str, threads: int, batch_size: int) -> None:
    """The reward model's process: load, then score lists of texts until told to stop."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.set_num_threads(threads)
    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
        if model.config.pad_token_id is None:  # last-token pooling needs to see the padding
            model.config.pad_token_id = tok.pad_token_id or tok.eos_token_id
        tok.pad_token_id = model.config.pad_token_id
        tok.padding_side = "right"
    except BaseException as e:  # reported to the parent
        conn.send(("error", repr(e)))
        return
    conn.send(("ok", None))
    while True:
        texts = conn.recv()
        if texts is None:
            return
        try:
            out: list[float] = []
            with torch.inference_mode():
                for i in range(0, len(texts), batch_size):
                    enc = tok(texts[i : i + batch_size], return_tensors="pt", padding=True)
                    out += model(**enc).logits[:, 0].float().tolist()
            conn.send(("ok", out))
        except BaseException as e:
            conn.send(("error", repr(e)))


class LocalScorer:
    """The checkpoint in a child process (spawned: a clean interpreter, killable). A child that
    has not loaded within the batch's deadline is killed (the caller has stopped waiting)."""

    def __init__(self, cfg: RewardModelConfig) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_child, args=(child, cfg.model, cfg.threads, cfg.batch_size), daemon=True
        )
        self._proc.start()
        child.close()
        self._answer(cfg.timeout_s + cfg.start_timeout_s)

    def _answer(self, timeout: float | None = None) -> Any:
        if not self._conn.poll(timeout):
            self.kill()
            raise RuntimeError("reward model process: no answer")
        try:
            kind, value = self._conn.recv()
        except (EOFError, OSError):
            raise RuntimeError(f"reward model process died ({self._proc.exitcode})") from None
        if kind == "error":
            raise RuntimeError(f"reward model process: {value}")
        return value

    def score(self, texts: list[str]) -> list[float]:
        try:
            self._conn.send(texts)
        except OSError:
            raise RuntimeError("reward model process is gone") from None
        out: list[float] = self._answer()
        return out

    def kill(self) -> None:
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)

    def shutdown(self) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send(None)
            except OSError:
                pass
            self._proc.join(10)
        self.kill()


class ServerScorer:
    """An SGLang reward server's ``/classify`` (see the module docstring; unrun against SGLang)."""

    def __init__(self, cfg: RewardModelConfig) -> None:
        self.url, self.timeout = cfg.server.rstrip("/") + "/classify", cfg.timeout_s

    def score(self, texts: list[str]) -> list[float]:
        import requests

        r = requests.post(self.url, json={"model": "default", "text": texts}, timeout=self.timeout)
        r.raise_for_status()
        body = r.json()
        rows = body if isinstance(body, list) else [body]
        return [float(row["embedding"][0]) for row in rows]


class RewardModel(Deadlined):
    """Scores (task, response) pairs, one batched call per step; see the module docstring."""

    kinds = ("timeout", "dead", "invalid")
    prefix = "reward_model"

    def __init__(
        self, cfg: RewardModelConfig, make: Callable[[], Any] | None = None, tokenizer: Any = None
    ) -> None:
        default = (lambda: ServerScorer(cfg)) if cfg.server else (lambda: LocalScorer(cfg))
        super().__init__(make or default, cfg.timeout_s, cfg.domains, cfg.start_timeout_s)
        self.cfg = cfg
        if tokenizer is None and cfg.model:  # the reward model's own chat template
            from megatron_rl.model.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(cfg.model)
        self.tokenizer = tokenizer

    def text(self, task: Task, response: str) -> str:
        msgs = [
            {"role": "user", "content": task.prompt},
            {"role": "assistant", "content": response},
        ]
        if self.tokenizer is None:
            return f"{task.prompt}\n{response}"
        out: str = self.tokenizer.apply_chat_template(msgs, tokenize=False)
        return out

    def score(self, items: list[tuple[Task, str]]) -> list[float | str]:
        """Per item its normalised score, or its failure kind; counts both."""
        if not items:
            return []
        texts = [self.text(t, r) for t, r in items]
        raw = self.run(len(items), lambda scorer: scorer.score(texts))
        if isinstance(raw, str):
            return [raw] * len(items)
        ok = [float(x) for x in raw if isinstance(x, int | float) and math.isfinite(x)]
        mean = sum(ok) / len(ok) if ok else 0.0
        sd = math.sqrt(sum((x - mean) ** 2 for x in ok) / len(ok)) if ok else 1.0
        out: list[float | str] = []
        for x in raw:
            if not (isinstance(x, int | float) and math.isfinite(x)):
                out.append("invalid")
            elif self.cfg.normalise == "sigmoid":
                out.append(1.0 / (1.0 + math.exp(-min(60.0, max(-60.0, x)))))
            elif self.cfg.normalise == "batch":
                out.append((x - mean) / sd if sd > 1e-8 else 0.0)
            else:
                out.append(float(x))
        self.count(out)
        return out
