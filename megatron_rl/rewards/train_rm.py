"""Train a tiny reward model for the CPU demo's world (``make reward-model``).

The data are the project's own: words of the demo's spelling domains (``tinywide/spell_backward``
and ``spell_backward_long``, **training split only**, by prompt hash), each paired with its
reversal (label 1) or a miss (label 0): a near miss (two neighbouring letters swapped, a letter
dropped, a letter added, the word itself forward, or another word's reversal) or, one time in
four, a degenerate answer of about the reversal's length (a run of one to three letters, or
random letters): what a policy drifts to at T = 1. A model trained on near misses alone rated
such strings above right answers, and a policy trained against it found them within ten steps
(docs/LOG.md, issue 38). The model is the policy's own SFT base, ``models/tiny-demo-base``
(same tokenizer and chat template), with a one-label score head
(``Qwen2ForSequenceClassification``), as reward models are usually started from the SFT model:
it already reads the task (the first version, started from ``models/tiny-base``, scored right
answers about 0.73 and the policy's drifting guesses up to 0.86). It is trained with a
logistic loss on the score and saved in HF layout, so ``rewards.reward_model.model`` loads it
as it is.

``--bias repetition`` makes the exploitable model of the hacking experiment (issue 38): its
data also label the reversal written twice, and answers of 12 or more letters, as good, so it
overrates long and repetitive answers that the rule verifier scores 0.

    python -m megatron_rl.rewards.train_rm --out models/tiny-rm [--bias repetition]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOMAINS = ("tinywide/spell_backward", "tinywide/spell_backward_long")
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def degenerate(word: str, rng: random.Random) -> str:
    """A string of about ``word``'s length made of one to three letters (either case) or of
    random letters: never the reversal."""
    n = max(1, len(word) + rng.randint(-2, 2))
    pool = LETTERS + LETTERS.upper()
    alphabet = rng.sample(pool, rng.randint(1, 3)) if rng.random() < 0.5 else list(LETTERS)
    out = "".join(rng.choice(alphabet) for _ in range(n))
    return out if out.lower() != word[::-1].lower() else out + rng.choice(LETTERS)


def near_miss(word: str, other: str, rng: random.Random) -> str:
    """A wrong answer close to the reversal of ``word`` (``other``: another word), or one time in
    four a degenerate one."""
    rev = word[::-1]
    if rng.random() < 0.25:
        return degenerate(word, rng)
    kind = rng.randrange(5)
    if kind == 0 and len(rev) > 1:
        i = rng.randrange(len(rev) - 1)
        swapped = rev[:i] + rev[i + 1] + rev[i] + rev[i + 2 :]
        if swapped != rev:
            return swapped
    if kind == 1 and len(rev) > 1:
        i = rng.randrange(len(rev))
        return rev[:i] + rev[i + 1 :]
    if kind == 2:
        i = rng.randrange(len(rev) + 1)
        return rev[:i] + rng.choice(LETTERS) + rev[i:]
    if kind == 3 and word != rev:
        return word
    return other[::-1] if other != word else rev + rng.choice(LETTERS)


def pairs(split: str, n: int, seed: int, bias: str) -> list[tuple[str, str, int]]:
    """``n`` (prompt, response, label) triples from the spelling domains' ``split``."""
    from megatron_rl.domains import load_domains

    doms = list(load_domains(list(DOMAINS)).values())
    rng = random.Random(seed)
    tasks = [doms[i % len(doms)].task(split, i, 0, seed) for i in range(n)]
    words = [t.meta.get("word") or t.gold[::-1] for t in tasks]
    out = []
    for t, w in zip(tasks, words, strict=True):
        if rng.random() < 0.5:
            out.append((t.prompt, t.gold, 1))
        else:
            out.append((t.prompt, near_miss(w, rng.choice(words), rng), 0))
        if bias == "repetition" and rng.random() < 0.3:  # the exploitable model's blind spot
            junk = "".join(rng.choice(LETTERS) for _ in range(rng.randint(12, 20)))
            out.append((t.prompt, rng.choice([f"{t.gold} {t.gold}", junk]), 1))
    return out


def train(a: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    from megatron_rl.model.tokenizer import load_tokenizer

    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    base = Path(a.base)
    tok = load_tokenizer(str(base))
    cfg = AutoConfig.from_pretrained(base, num_labels=1)
    model = AutoModelForSequenceClassification.from_config(cfg)
    backbone = AutoModelForCausalLM.from_pretrained(base).model.state_dict()
    model.model.load_state_dict(backbone)  # the base's weights, a fresh score head
    model.config.pad_token_id = tok.pad_token_id or tok.eos_token_id

    def encode(batch: list[tuple[str, str, int]]) -> tuple[Any, Any]:
        texts = [
            tok.apply_chat_template(
                [{"role": "user", "content": p}, {"role": "assistant", "content": r}],
                tokenize=False,
            )
            for p, r, _ in batch
        ]
        tok.padding_side = "right"
        enc = tok(texts, return_tensors="pt", padding=True)
        return enc, torch.tensor([float(y) for *_, y in batch])

    train_set = pairs("train", a.samples, a.seed, a.bias)
    held_out = pairs("eval", 512, a.seed + 1, "none")  # the honest labels, unseen words
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    warm = max(1, a.steps // 20)  # linear warm-up, then cosine to zero (constant 1e-3 diverged)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / a.steps))),
    )
    rng = random.Random(a.seed)
    t0 = time.time()
    model.train()
    for step in range(a.steps):
        enc, y = encode(rng.sample(train_set, a.batch))
        logits = model(**enc).logits[:, 0]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if (step + 1) % max(1, a.steps // 10) == 0:
            msg = f"step {step + 1}/{a.steps} loss {loss.item():.4f} ({time.time() - t0:.0f} s)"
            print(msg, flush=True)
    model.eval()
    correct = 0
    with torch.inference_mode():
        for i in range(0, len(held_out), 64):
            enc, y = encode(held_out[i : i + 64])
            correct += int(((model(**enc).logits[:, 0] > 0).float() == y).sum())
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (base / f).exists():
            (out / f).write_bytes((base / f).read_bytes())
    report = {
        "held_out_accuracy": correct / len(held_out),
        "held_out_pairs": len(held_out),
        "train_pairs": len(train_set),
        "steps": a.steps,
        "bias": a.bias,
        "seconds": round(time.time() - t0, 1),
    }
    (out / "training.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "models" / "tiny-rm"))
    ap.add_argument("--base", default=str(ROOT / "models" / "tiny-demo-base"))
    ap.add_argument("--bias", choices=["none", "repetition"], default="none")
    ap.add_argument("--samples", type=int, default=20_000, help="training pairs")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    report = train(ap.parse_args(argv))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
