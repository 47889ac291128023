"""The TRL side of ``rl_vs_trl.py``: ``GRPOTrainer`` on megatron-rl's planned tasks, timed by phase.

Runs in its own process (``python -m benchmarks.trl_grpo SPEC.json``, started by rl_vs_trl.py)
and prints one ``RESULT {json}`` line. TRL is configured as its docs recommend on a CPU:
``use_cpu=True``, fp32, ``transformers`` generation (no vLLM), gradient checkpointing off (TRL
turns it on by default to save GPU memory; a model this size on a CPU has no memory pressure, and
megatron-rl does not recompute either), the same torch thread count, one generation batch per
optimizer step, and the same cosine LR schedule (``cosine_with_min_lr``) as megatron-rl.

Phases, the same boundaries as megatron-rl's ``time/*_s``: a step is the interval between two
``on_step_end`` callbacks, so a step's logging (after ``on_step_end``) counts in the next one.
``generate`` is ``_generate``, ``score`` the reward call (``_calculate_rewards``), ``log`` TRL's
``log``; ``other`` is the rest of ``_generate_and_score_completions`` (tokenising, padding,
advantages); ``train`` is what remains: forward, backward, clipping and the optimizer step.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.rl_vs_trl import plan_tasks, run_config


class PhaseClock:
    """Seconds per phase in each step interval, and the LR each optimizer step used."""

    def __init__(self) -> None:
        self.current: dict[str, float] = {}
        self.steps: list[dict[str, float]] = []
        self.lrs: list[float] = []
        self.tokens = {"real": 0.0, "padded": 0.0, "response": 0.0}
        self.evals: list[dict[str, float]] = []  # periodic held-out sweeps
        self.start_mean: float | None = None
        self.last = 0.0
        self.last_cpu = 0.0

    def add(self, phase: str, seconds: float) -> None:
        self.current[phase] = self.current.get(phase, 0.0) + seconds

    def timed(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self.add(phase, time.perf_counter() - t0)

        return wrapper

    def step_end(self) -> None:
        now, cpu = time.perf_counter(), time.process_time()
        row = dict(self.current, step=now - self.last, step_cpu=cpu - self.last_cpu)
        gas = row.pop("gen_and_score", 0.0)
        row["other"] = max(0.0, gas - row.get("generate", 0.0) - row.get("score", 0.0))
        row["train"] = max(0.0, row["step"] - gas - row.get("log", 0.0))
        self.steps.append(row)
        self.current, self.last, self.last_cpu = {}, now, cpu

    def sweep(self, run: Callable[[], float], step: int) -> None:
        """A held-out sweep (``run`` returns the mean), left out of the step clock."""
        t0, c0 = time.perf_counter(), time.process_time()
        mean = run()
        self.last += time.perf_counter() - t0
        self.last_cpu += time.process_time() - c0
        train_s = sum(row["step"] for row in self.steps)
        self.evals.append({"step": step, "train_s": train_s, "mean": mean})

    def done(self, gain: float | None, cap_s: float | None) -> bool:
        """Stop early: the latest sweep is ``gain`` above the start one, or training time has
        reached ``cap_s``."""
        start, evals = self.start_mean, self.evals
        if gain is not None and start is not None and evals:
            if evals[-1]["mean"] >= start + gain - 1e-9:
                return True
        return cap_s is not None and sum(r["step"] for r in self.steps) >= cap_s

    def callback(
        self,
        sweep: Callable[[Any], float] | None = None,
        every: int = 0,
        gain: float | None = None,
        cap_s: float | None = None,
    ) -> Any:
        """Times steps; with ``sweep(model)`` also a sweep at the start and every ``every``;
        training stops after the sweep ``gain`` above the start or the step that reaches
        ``cap_s`` seconds of training (the time-to-gain run)."""
        from transformers import TrainerCallback

        clock = self

        class Clock(TrainerCallback):  # type: ignore[misc]
            def on_train_begin(self, *args: Any, **kw: Any) -> None:
                clock.last, clock.last_cpu = time.perf_counter(), time.process_time()
                if sweep is not None:
                    clock.start_mean = sweep(kw["model"])
                    clock.last, clock.last_cpu = time.perf_counter(), time.process_time()

            def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                clock.lrs.append(float(kw["optimizer"].param_groups[0]["lr"]))

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                clock.step_end()
                if sweep is not None and every and state.global_step % every == 0:
                    if state.global_step < args.max_steps:  # the final sweep is held_out's
                        clock.sweep(lambda: sweep(kw["model"]), state.global_step)
                if clock.done(gain, cap_s):
                    control.should_training_stop = True

        return Clock()


def trl_config(spec: dict[str, Any], out: Path) -> Any:
    """GRPOConfig matching megatron-rl's settings (one generation batch per optimizer step)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out),
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        seed=spec["seed"],
        max_steps=spec["steps"],
        learning_rate=spec["lr"],
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr": spec["min_lr"]},
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.95,
        adam_epsilon=1e-8,
        max_grad_norm=1.0,
        per_device_train_batch_size=spec["prompts"] * spec["group"],
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=spec["group"],
        num_iterations=1,
        max_completion_length=spec["max_tokens"],
        temperature=1.0,
        top_p=1.0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",
        scale_rewards="group",
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        dataloader_num_workers=0,
    )


def make_reward(domains: dict[str, Any]) -> Any:
    """TRL reward function: the domain's verifier and compose_reward, as megatron-rl scores."""
    from megatron_rl.domains import Task
    from megatron_rl.domains.reward import compose_reward
    from megatron_rl.evaluation.evaluate import safe_verify

    def reward(completions: list[Any], task: list[str], **_: Any) -> list[float]:
        out = []
        for comp, tj in zip(completions, task, strict=True):
            t = Task.from_dict(json.loads(tj))
            text = comp[0]["content"] if isinstance(comp, list) else str(comp)
            verdict = safe_verify(domains[t.domain], t, text)
            weights = domains[t.domain].reward_weights
            out.append(0.0 if verdict is None else compose_reward(verdict, text, weights)[0])
        return out

    return reward


def timed_trainer(clock: PhaseClock) -> Any:
    """GRPOTrainer whose generation, reward, batch preparation and logging are timed."""
    from trl import GRPOTrainer

    class TimedGRPO(GRPOTrainer):  # type: ignore[misc]
        def _generate(self, *a: Any, **kw: Any) -> Any:
            return clock.timed("generate", super()._generate)(*a, **kw)

        def _calculate_rewards(self, *a: Any, **kw: Any) -> Any:
            return clock.timed("score", super()._calculate_rewards)(*a, **kw)

        def _generate_and_score_completions(self, *a: Any, **kw: Any) -> Any:
            out = clock.timed("gen_and_score", super()._generate_and_score_completions)(*a, **kw)
            real = out["prompt_mask"].sum() + out["completion_mask"].sum()
            clock.tokens["real"] += float(real)
            clock.tokens["response"] += float(out["completion_mask"].sum())
            clock.tokens["padded"] += float(
                out["prompt_ids"].numel() + out["completion_ids"].numel()
            )
            return out

        def log(self, *a: Any, **kw: Any) -> None:
            clock.timed("log", super().log)(*a, **kw)

    return TimedGRPO


class HeldOut:
    """megatron-rl's held-out sweep (``rl_eval.RLEval``: the same distinct prompts, the same
    ``evaluate`` call) on a model's current weights, through the HF engine."""

    def __init__(self, spec: dict[str, Any], domains: dict[str, Any]) -> None:
        from megatron_rl.evaluation.sweeps import RLEval
        from megatron_rl.model.tokenizer import load_tokenizer
        from megatron_rl.rollout.build import build_engine
        from megatron_rl.rollout.config import RolloutConfig

        self.evals = RLEval(run_config(spec), domains)
        self.tokenizer = load_tokenizer(spec["model"])
        self.engine = build_engine(RolloutConfig(engine="hf"), spec["model"], spec["seed"])

    def accuracy(self, model: Any) -> dict[str, float]:
        self.engine.update_weights({k: v.detach() for k, v in model.state_dict().items()})
        res = self.evals.score(self.engine, self.tokenizer, self.evals.held_out)
        return dict(res.accuracy)

    def mean(self, model: Any) -> float:
        acc = self.accuracy(model)
        return sum(acc.values()) / len(acc)


def main(spec_path: str) -> None:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from megatron_rl.domains import load_domains

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(spec["threads"])
    cfg = run_config(spec)
    domains = load_domains(cfg.domains.include, cfg.domains.exclude, cfg.domains.task_files)
    tasks = plan_tasks(spec, cfg, domains)
    rows = [
        {"prompt": [{"role": "user", "content": t["prompt"]}], "task": json.dumps(t)} for t in tasks
    ]
    out = Path(spec["out"])
    clock = PhaseClock()
    held = HeldOut(spec, domains)
    every = int(spec.get("eval_every", 0))
    trainer = timed_trainer(clock)(
        model=AutoModelForCausalLM.from_pretrained(spec["model"], dtype="float32"),
        reward_funcs=make_reward(domains),
        args=trl_config(spec, out),
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(spec["model"]),
        callbacks=[
            clock.callback(held.mean if every else None, every, spec.get("gain"), spec.get("cap_s"))
        ],
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    accuracy = held.accuracy(trainer.model)  # the final weights, as megatron-rl's last sweep
    if every and not (clock.evals and clock.evals[-1]["step"] == len(clock.steps)):
        final = {"step": len(clock.steps), "train_s": sum(r["step"] for r in clock.steps)}
        clock.evals.append(dict(final, mean=sum(accuracy.values()) / len(accuracy)))
    held.engine.shutdown()
    result = {
        "steps": clock.steps,
        "lrs": clock.lrs,
        "tokens": clock.tokens,
        "completion_len": [h["completions/mean_length"] for h in logs],
        "accuracy": accuracy,
        "mean_before": clock.start_mean,
        "evals": clock.evals,
        "reward": [float(h.get("reward", float("nan"))) for h in logs],  # mean over samples
        "grad_norm": [float(h.get("grad_norm", float("nan"))) for h in logs],  # before clipping
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
