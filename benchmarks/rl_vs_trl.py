"""End-to-end GRPO: megatron-rl against TRL's ``GRPOTrainer`` on the same machine, same work.

Both tools start from the same HF-layout policy (``models/tiny-base`` when it exists, else a
random ``3m`` Qwen2 from ``tiny_model``: then both score ~0 and only the speed figures mean
anything; the output says which one was used). Both train on the same prompts in the same order:
the ``tiny/*`` tasks that megatron-rl's uniform scheduler plans for each step, rendered by the
same chat template (TRL applies the tokenizer's template to conversational prompts, as
``render_chat`` does), with a reward function that calls the same verifier and
``compose_reward``. Same group size, prompts per step, response length, steps, learning rate,
Adam betas, grad clip, clip range (0.2 / 0.28), token-mean loss (TRL ``loss_type="dapo"``),
group-std advantages and no KL. TRL runs as its docs recommend on a CPU: ``use_cpu=True``, fp32,
no vLLM, ``transformers`` generation; one generation batch per optimizer step (on-policy).

Deviations, stated: megatron-rl also syncs weights to its engine every step (TRL generates with
the training model, nothing to sync) and applies its truncated-IS correction; the zero-variance
filter is off so both train on every group. Each tool runs in its own subprocess with the same
torch thread count. Held-out accuracy: the same greedy ``evaluate`` call on the same eval tasks
(megatron-rl's own end-of-run sweep; for TRL, the HF engine on TRL's final weights).

    .venv/bin/python benchmarks/rl_vs_trl.py --steps 10 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BASE_MODEL = ROOT / "models" / "tiny-base"


def overrides(a: argparse.Namespace, model: Path, out: Path) -> list[str]:
    """Config overrides shared by the megatron-rl run and the TRL prompt plan."""
    return [
        f"output_dir={out}",
        "run_name=mrl",
        f"seed={a.seed}",
        f"model.hf_path={model}",
        f"train.steps={a.steps}",
        f"train.lr={a.lr}",
        f"train.threads={a.threads}",
        f"rl.prompts_per_step={a.prompts}",
        f"rl.group_size={a.group}",
        "rl.kl_coef=0.0",
        "rl.eval_every=0",
        f"rl.eval_samples_per_domain={a.eval_n}",
        f"rollout.max_new_tokens={a.max_tokens}",
        "rollout.engine=hf",
        "scheduler.policy=uniform",
        "scheduler.filter_zero_variance=false",
        "checkpoint.every=0",
        "tracking.wandb=disabled",
        "tracking.progress=false",
    ]


def run_megatron(a: argparse.Namespace, model: Path, out: Path) -> dict[str, Any]:
    """``megatron-rl train`` as a user runs it; numbers come from metrics.jsonl/summary.json."""
    cli = [str(Path(sys.executable).parent / "megatron-rl"), "train"]
    cmd = [*cli, str(ROOT / "configs/demo_cpu.yaml"), *overrides(a, model, out)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, timeout=a.timeout)
    wall = time.perf_counter() - t0
    run = out / "mrl"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/step_s" in r]
    summary = json.loads((run / "summary.json").read_text())
    step_s = [r["time/step_s"] for r in rows]
    gen = [r["rollout/response_len_mean"] * r["rollout/samples"] for r in rows]
    gen_s = [r.get("time/generate_s", 0.0) for r in rows]
    train_s = [r.get("time/train_s", 0.0) for r in rows]
    trained = [r.get("perf/trained_tokens_per_s", 0.0) * r.get("time/train_s", 0.0) for r in rows]
    return {
        "steps": len(rows),
        "step_s": sum(step_s) / len(step_s),
        "generated_tokens_per_s": sum(gen) / max(sum(gen_s), 1e-9),
        "trained_tokens_per_s": sum(trained) / max(sum(train_s), 1e-9),
        "generated_tokens_per_step_s": sum(gen) / sum(step_s),
        "accuracy": summary["mean_after"],
        "accuracy_before": summary["mean_before"],
        "process_wall_s": wall,
    }


def plan_tasks(a: argparse.Namespace, model: Path, out: Path) -> list[dict[str, Any]]:
    """The tasks megatron-rl trains on, step by step (same scheduler, seed and cursor)."""
    from megatron_rl.config import load_config
    from megatron_rl.domains import load_domains
    from megatron_rl.scheduler import DomainInfo, DomainScheduler
    from megatron_rl.train.rollout_phase import make_tasks

    cfg = load_config(ROOT / "configs/demo_cpu.yaml", overrides(a, model, out))
    domains = load_domains(cfg.domains.include, cfg.domains.exclude, cfg.domains.task_files)
    infos = [DomainInfo(d.name, d.tier, list(d.levels), list(d.tags)) for d in domains.values()]
    sched = DomainScheduler(cfg.scheduler, infos, cfg.seed)
    cursor: dict[str, int] = {}
    tasks = []
    for step in range(a.steps):
        specs = sched.plan(step, a.prompts)
        tasks += [t.to_dict() for t in make_tasks(specs, domains, cursor, cfg.seed)]
    return tasks


def run_trl_child(a: argparse.Namespace) -> None:
    """In a subprocess: plan the tasks, train with GRPOTrainer, evaluate; print one JSON line."""
    import torch

    torch.set_num_threads(a.threads)
    model, out = Path(a.model), Path(a.out)
    result = train_and_eval(a, model, out, plan_tasks(a, model, out))
    print("RESULT " + json.dumps(result), flush=True)


class _Timing:
    """TrainerCallback recording the wall time at the end of every optimizer step."""

    def __init__(self) -> None:
        self.start = 0.0
        self.ends: list[float] = []

    def callback(self) -> Any:
        from transformers import TrainerCallback

        timing = self

        class CB(TrainerCallback):
            def on_train_begin(self, *args: Any, **kw: Any) -> None:
                timing.start = time.perf_counter()

            def on_step_end(self, *args: Any, **kw: Any) -> None:
                timing.ends.append(time.perf_counter())

        return CB()


def trl_config(a: argparse.Namespace, out: Path) -> Any:
    """GRPOConfig matching megatron-rl's settings (one generation batch per optimizer step)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out),
        use_cpu=True,
        bf16=False,
        seed=a.seed,
        max_steps=a.steps,
        learning_rate=a.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.95,
        adam_epsilon=1e-8,
        max_grad_norm=1.0,
        per_device_train_batch_size=a.prompts * a.group,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=a.group,
        num_iterations=1,
        max_completion_length=a.max_tokens,
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
    from megatron_rl.train.evaluate import safe_verify

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


def train_and_eval(
    a: argparse.Namespace, model_dir: Path, out: Path, tasks: list[dict[str, Any]]
) -> dict[str, Any]:
    """GRPOTrainer on ``tasks`` in order, then greedy held-out eval of its final weights."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from megatron_rl.domains import load_domains

    domains = load_domains(["tiny/*"], [], [])
    rows = [
        {"prompt": [{"role": "user", "content": t["prompt"]}], "task": json.dumps(t)} for t in tasks
    ]
    gen_s: list[float] = []

    class TimedGRPO(GRPOTrainer):  # type: ignore[misc]
        """Measures generation time only; the training path is TRL's own."""

        def _generate(self, prompts: list[Any]) -> Any:
            t0 = time.perf_counter()
            try:
                return super()._generate(prompts)
            finally:
                gen_s.append(time.perf_counter() - t0)

    timing = _Timing()
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="float32")
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    trainer = TimedGRPO(
        model=model,
        reward_funcs=make_reward(domains),
        args=trl_config(a, out),
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        callbacks=[timing.callback()],
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    total_s = timing.ends[-1] - timing.start
    gen_tokens = sum(h["completions/mean_length"] for h in logs) * a.prompts * a.group
    trained_tokens = trainer.state.num_input_tokens_seen
    trainer.save_model(str(out / "final"))
    tok.save_pretrained(str(out / "final"))
    return {
        "steps": len(timing.ends),
        "step_s": total_s / len(timing.ends),
        "generated_tokens_per_s": gen_tokens / max(sum(gen_s), 1e-9),
        # prompt + completion tokens over the step time outside generation
        "trained_tokens_per_s": trained_tokens / max(total_s - sum(gen_s), 1e-9),
        "generated_tokens_per_step_s": gen_tokens / total_s,
        "accuracy": held_out_accuracy(a, out / "final", domains),
    }


def held_out_accuracy(a: argparse.Namespace, model_dir: Path, domains: dict[str, Any]) -> float:
    """Mean greedy accuracy on the eval tasks megatron-rl's end-of-run sweep uses."""
    from megatron_rl.model.tokenizer import load_tokenizer
    from megatron_rl.rollout.base import build_engine
    from megatron_rl.rollout.config import RolloutConfig
    from megatron_rl.train.evaluate import evaluate

    engine = build_engine(RolloutConfig(engine="hf"), str(model_dir), a.seed)
    tok = load_tokenizer(model_dir)
    try:
        return evaluate(engine, tok, domains, a.eval_n, a.seed, a.max_tokens, level=0).mean
    finally:
        engine.shutdown()


def run_trl(a: argparse.Namespace, model: Path, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child-trl", "--model", str(model), "--out", str(out)]
    cmd += [f"--{k.replace('_', '-')}={v}" for k, v in shared_args(a).items()]
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd, cwd=ROOT, timeout=a.timeout, stdout=subprocess.PIPE, text=True, check=True
    )
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return dict(json.loads(line[len("RESULT ") :]), process_wall_s=time.perf_counter() - t0)


def shared_args(a: argparse.Namespace) -> dict[str, Any]:
    keys = ("steps", "prompts", "group", "max_tokens", "lr", "threads", "eval_n", "seed")
    return {k: getattr(a, k) for k in keys}


def pick_model(tmp: Path) -> tuple[Path, str]:
    if (BASE_MODEL / "config.json").is_file():
        return BASE_MODEL, "models/tiny-base"
    from megatron_rl.rollout.tiny_model import make_tiny_qwen2

    return make_tiny_qwen2(tmp / "model", "3m", seed=0, init_std=0.02), "random 3m (no tiny-base)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10, help="optimizer steps of each tool")
    p.add_argument("--prompts", type=int, default=8, help="prompts (groups) per step")
    p.add_argument("--group", type=int, default=8, help="completions per prompt")
    p.add_argument("--max-tokens", type=int, default=24, help="response length cap, tokens")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--threads", type=int, default=2, help="torch threads of each tool")
    p.add_argument("--eval-n", type=int, default=32, help="held-out tasks per domain")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=900, help="seconds per tool")
    p.add_argument("--json", default=None, help="write the numbers here")
    p.add_argument("--child-trl", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child_trl:
        return run_trl_child(a)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        model, model_name = pick_model(Path(tmp))
        mrl = run_megatron(a, model, Path(tmp) / "mrl")
        trl = run_trl(a, model, Path(tmp) / "trl")
    res = {
        "setup": dict(shared_args(a), model=model_name, cores=os.cpu_count(), load_avg_1m=load0),
        "megatron_rl": mrl,
        "trl": trl,
        "step_time_ratio": mrl["step_s"] / trl["step_s"],
        "speedup": trl["step_s"] / mrl["step_s"],
        "accuracy": {"megatron_rl": mrl["accuracy"], "trl": trl["accuracy"]},
    }
    print_table(res)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))


def print_table(res: dict[str, Any]) -> None:
    s = res["setup"]
    print(
        f"\nGRPO {s['steps']} steps x {s['prompts']} prompts x n={s['group']} x <= "
        f"{s['max_tokens']} tokens, model {s['model']}, cores={s['cores']} "
        f"threads={s['threads']} load_avg_1m={s['load_avg_1m']:.1f}"
    )
    keys = ("step_s", "generated_tokens_per_s", "trained_tokens_per_s", "accuracy")
    print(f"{'':<24}{'megatron-rl':>14}{'TRL':>14}{'ratio':>10}")
    for k in keys:
        m, t = res["megatron_rl"][k], res["trl"][k]
        print(f"{k:<24}{m:>14.3f}{t:>14.3f}{m / t if t else float('nan'):>10.3f}")
    print(f"step time ratio megatron-rl / TRL = {res['step_time_ratio']:.3f}")


if __name__ == "__main__":
    main()
