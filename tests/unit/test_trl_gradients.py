"""megatron-rl's GRPO gradients against TRL's own loss, variant by variant (issue 37).

One step of scored groups from ``models/tiny-demo-base``: TRL's ``GRPOTrainer`` generates it
(``_generate``: the model's own samples at temperature ``TEMP``, on real tiny-domain prompts of
different lengths, so TRL left-pads them) and scores it (``_generate_and_score_completions``:
rewards, group advantages, ``num_items_in_batch``, old / reference log-probs and the
importance-sampling ratio, all by TRL's code; later calls replay the recorded generation, so
every variant sees the same tokens). The same prompts, completions and rewards become
megatron-rl ``Group``s, which go through ``controller/batches.build_batches`` (advantages,
shared-prefix packing over several micro-batches) and ``train/step.train_step``.

Gradients: ours are every parameter's ``main_grad`` (Megatron DDP's fp32 gradient buffer),
read at the moment ``train_step`` calls ``policy.optimizer_step`` (before the step, which then
runs as usual; each test restores weights and optimizer state afterwards). They are mapped to
HF names with the project's converter (``convert.megatron_to_hf`` applied to the gradients, a
pure re-layout). TRL's are ``.grad`` after ``trainer.compute_loss(model, inputs).backward()``
on an ``AutoModelForCausalLM`` holding the same weights. All fp32 (TRL's ``GRPOConfig``
defaults to ``bf16=True``, which autocasts on CPU too and puts its log-probs ~1e-2 nats off; the
config here sets it off, as ``benchmarks/trl_grpo.py`` does).

Checked per shared variant: the advantages (abs 1e-6), the loss value, and every gradient
tensor: ``|g_ours - g_trl| <= RTOL * |g_trl| + ATOL`` (Frobenius norms, ``RTOL`` 1e-4,
``ATOL`` 1e-8 the floor for near-zero tensors). The normaliser of each aggregation is checked
separately (1e-6), measured from TRL's loss with unit per-token terms. The mapping table and
what each variant means is in docs/losses.md, "Against TRL". A mismatched setting (our
sequence mean against TRL's ``dapo``, TIS against no IS, k3 against TRL's bias-corrected k3)
must fail the same check. Variants one tool has and the other lacks are listed as skipped
``test_no_trl_counterpart[...]`` tests, each naming the setting.

Written against trl 1.16.0 (``_generate``, ``_generate_and_score_completions`` and
``_compute_loss`` are TRL internals; a TRL upgrade that renames them fails here loudly).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "tiny-demo-base"
# (prompt, gold answer): spell_backward_long, chain_sum, count_bits, arith3 of tinywide/*
TASKS = [
    ("Spell this word backward (example: sun -> nus): Jahvist", "tsivhaJ"),
    ("Spell this word backward (example: sun -> nus): scrawm", "mwarcs"),
    ("State the final answer to the following arithmetic problem: 54 - 57 =", "-3"),
    ("How many 1 bits are there in the binary representation of the number 796?", "5"),
    ("Calculate 0 + 10 - 2.", "8"),
]
N = 4  # samples per group
MAX_NEW = 10  # max_completion_length = rl.max_response_tokens (Dr.GRPO's constant)
TEMP = 1.2  # sampling and scoring temperature (both tools divide the logits by it)
SEED = 1
BUDGET = 100  # micro-batch token budget: the step spans several micro-batches
RTOL, ATOL = 1e-4, 1e-8  # per-tensor relative error and its absolute floor (norms)
ADV_TOL = NORM_TOL = 1e-6
TIS_CAP = 1.2
KL_COEF = 0.05
LR_FIRST_STEP = 3e-3  # the first step of a second pass: moves the ratio away from 1


def reward(completions: list[Any], gold: list[str], **_: Any) -> list[float]:
    """Exact match plus partial credit (digits: closeness; words: letters in place)."""
    out = []
    for c, g in zip(completions, gold, strict=True):
        text = c[0]["content"].strip()
        try:
            partial = 1.0 / (1.0 + abs(float(text) - float(g)))
        except ValueError:
            partial = sum(a == b for a, b in zip(text, g, strict=False)) / max(len(text), len(g))
        out.append(float(text == g) + 0.5 * partial)
    return out


# ---------------------------------------------------------------------------------- variants


@dataclass(frozen=True)
class Variant:
    """One objective in both tools: our ``rl.*`` settings and TRL's ``GRPOConfig`` fields."""

    ours: dict[str, Any]
    trl: dict[str, Any]
    perturb: bool = False  # the policy moved away from the reference (tiny-demo-base)
    engine_lp: bool = False  # the engine's log-probs differ from the trainer's (IS / TIS)
    # the gradient of a second pass over the batch, pi_old the policy that scored it: "step" one
    # optimizer step later (ours), "perturbed" after the weights moved at random (so that tokens
    # with A < 0 also have ratios > 1)
    second_pass: str | None = None
    compare_loss: bool = True  # the loss values are the same quantity


TOKEN_MEAN = {"loss_agg": "token_mean"}
SECOND = {"clip_low": 0.2, "clip_high": 0.28, **TOKEN_MEAN}
VARIANTS: dict[str, Variant] = {
    "token_mean_vs_dapo": Variant(TOKEN_MEAN, {"loss_type": "dapo"}),
    "seq_mean_token_mean_vs_grpo": Variant(
        {"loss_agg": "seq_mean_token_mean"}, {"loss_type": "grpo"}
    ),
    "seq_mean_token_sum_vs_luspo": Variant(
        {"loss_agg": "seq_mean_token_sum"},
        {"loss_type": "luspo", "importance_sampling_level": "sequence"},
    ),
    "drgrpo_vs_dr_grpo": Variant(
        {"loss_agg": "seq_mean_token_sum_norm", "advantage": "drgrpo"},
        {"loss_type": "dr_grpo", "scale_rewards": "none"},
    ),
    "clip_higher_second_pass": Variant(
        SECOND,
        {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28, "num_iterations": 2},
        second_pass="step",
    ),
    "dual_clip_vs_delta_second_pass": Variant(
        {**SECOND, "dual_clip": 1.3},
        {
            "loss_type": "dapo",
            "epsilon": 0.2,
            "epsilon_high": 0.28,
            "num_iterations": 2,
            "delta": 1.3,
        },
        second_pass="perturbed",
    ),
    "kl_k3": Variant(
        {**TOKEN_MEAN, "kl_coef": KL_COEF, "kl_estimator": "k3"},
        {"loss_type": "dapo", "beta": KL_COEF, "use_bias_correction_kl": False},
        perturb=True,
    ),
    # TRL's default KL (k3 times the differentiable ratio) has the gradient of our k2 on a first
    # pass (both are the reverse KL's); their values differ, so only gradients are compared
    "kl_k2_vs_trl_bias_corrected_k3": Variant(
        {**TOKEN_MEAN, "kl_coef": KL_COEF, "kl_estimator": "k2"},
        {"loss_type": "dapo", "beta": KL_COEF, "use_bias_correction_kl": True},
        perturb=True,
        compare_loss=False,
    ),
    "tis_vs_token_truncate": Variant(
        {**TOKEN_MEAN, "tis_cap": TIS_CAP},
        {
            "loss_type": "dapo",
            "vllm_importance_sampling_mode": "token_truncate",
            "vllm_importance_sampling_clip_max": TIS_CAP,
        },
        engine_lp=True,
    ),
    "entropy_bonus_token_mean": Variant(
        {**TOKEN_MEAN, "entropy_coef": 0.01}, {"loss_type": "dapo", "entropy_coef": 0.01}
    ),
}


# ---------------------------------------------------------------------------------- fixtures


def _trl_args(tmp: Path, **overrides: Any) -> Any:
    from trl import GRPOConfig

    fields: dict[str, Any] = dict(
        output_dir=str(tmp),
        report_to="none",
        use_cpu=True,
        bf16=False,  # TRL's default is True (bf16 autocast, also on CPU): 1e-2 nats off fp32
        fp16=False,
        per_device_train_batch_size=len(TASKS) * N,
        num_generations=N,
        max_completion_length=MAX_NEW,
        temperature=TEMP,
        seed=SEED,
        disable_dropout=True,
        epsilon=0.2,
        epsilon_high=0.28,
    )
    fields.update(overrides)
    return GRPOConfig(**fields)


def _hf_model(weights: dict[str, torch.Tensor]) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(MODEL), dtype=torch.float32)
    model.load_state_dict(weights, strict=True)
    return model


def _inputs() -> list[dict[str, Any]]:
    """The rows of one generation batch as TRL's sampler yields them: each prompt N times."""
    return [
        {"prompt": [{"role": "user", "content": p}], "gold": g} for p, g in TASKS for _ in range(N)
    ]


@pytest.fixture(scope="module")
def step(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One generated and scored step: TRL's recorded ``_generate`` output, rewards, weights."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from megatron_rl.model import hf_io

    hf_sd, model_cfg = hf_io.load_hf(MODEL)
    tok = AutoTokenizer.from_pretrained(str(MODEL))
    rows = _inputs()
    data = Dataset.from_dict(
        {"prompt": [r["prompt"] for r in rows[::N]], "gold": [g for _, g in TASKS]}
    )
    trainer = GRPOTrainer(
        model=_hf_model(hf_sd),
        reward_funcs=reward,
        args=_trl_args(tmp_path_factory.mktemp("trl")),
        train_dataset=data,
        processing_class=tok,
    )
    recorded: list[tuple[Any, ...]] = []
    generate = trainer._generate

    def record(prompts: list[Any]) -> tuple[Any, ...]:
        recorded.append(generate(prompts))
        return recorded[-1]

    trainer._generate = record
    torch.manual_seed(SEED)
    out = trainer._generate_and_score_completions(rows)
    gen = recorded[0]
    prompt_ids, completion_ids, completions = gen[0], gen[1], gen[3]
    # the trainer's own log-probs of the sampled tokens (TRL's function), and an "engine's":
    # the same plus noise, so TIS / IS ratios spread on both sides of the cap
    with torch.no_grad():
        lp, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            torch.cat([out["prompt_ids"], out["completion_ids"]], 1),
            torch.cat([out["prompt_mask"], out["completion_mask"]], 1),
            out["completion_ids"].size(1),
        )
    noise = torch.randn(lp.shape, generator=torch.Generator().manual_seed(SEED)) * 0.25
    engine = [(lp[i] + noise[i])[: len(c)].tolist() for i, c in enumerate(completion_ids)]
    gen_engine = (*gen[:4], engine, *gen[5:])
    rewards = reward(completions, [r["gold"] for r in rows])
    # real groups, mixed rewards, different lengths (else the aggregations would coincide)
    assert sum(torch.tensor(rewards).view(-1, N).std(1) > 0) >= 3, rewards
    assert len({len(c) for c in completion_ids}) >= 3 and len({len(p) for p in prompt_ids}) >= 3
    gen_w = torch.Generator().manual_seed(SEED + 1)
    perturbed = {k: v + 0.02 * torch.randn(v.shape, generator=gen_w) for k, v in hf_sd.items()}
    return dict(
        gen=gen, gen_engine=gen_engine, rewards=rewards, engine_lp=engine, tok=tok, data=data,
        hf_sd=hf_sd, perturbed=perturbed, model_cfg=model_cfg,
        tmp=tmp_path_factory.mktemp("trl_variants"),
    )  # fmt: skip


@pytest.fixture(scope="module")
def policy(dist1: Any, step: dict[str, Any]) -> Iterator[Any]:
    from megatron_rl.config.train import TrainConfig
    from megatron_rl.model.policy import Policy

    pol = Policy(step["model_cfg"], dist1, TrainConfig(lr=1e-3, grad_clip=0.0))
    pol.load_hf_state_dict(step["hf_sd"])
    pol.opt0 = pol.optimizer_state()
    yield pol


# ---------------------------------------------------------------------------------- our side


def _groups(step: dict[str, Any]) -> list[Any]:
    """TRL's generation as megatron-rl's scored groups (the rollout phase's output)."""
    from megatron_rl.rollout.groups import Group, Sample
    from megatron_rl.scheduler import GroupSpec

    prompt_ids, completion_ids, _, completions = step["gen"][:4]
    groups = []
    for g in range(len(TASKS)):
        grp = Group(GroupSpec("tinywide/mixed", 0, TEMP), None)  # type: ignore[arg-type]
        for i in range(g * N, (g + 1) * N):
            ids = list(completion_ids[i])
            grp.samples.append(Sample(
                "tinywide/mixed", list(prompt_ids[i]), ids, step["engine_lp"][i], [1.0] * len(ids),
                completions[i][0]["content"], "stop", step["rewards"][i],
            ))  # fmt: skip
        groups.append(grp)
    return groups


def _cfg(ours: dict[str, Any], lr: float = 1e-3) -> Any:
    from megatron_rl.config import load_config

    cfg = load_config(None, [f"rl.group_size={N}", f"rl.prompts_per_step={len(TASKS)}",
                             f"rl.max_response_tokens={MAX_NEW}", "train.grad_clip=0",
                             f"train.lr={lr}"])  # fmt: skip
    cfg.rl.tis_cap = None  # TRL without an engine has no IS correction
    for k, v in ours.items():
        setattr(cfg.rl, k, v)
    cfg.rl.validate()
    return cfg


def _hf_grads(policy: Any) -> dict[str, torch.Tensor]:
    """Every parameter's accumulated gradient, mapped to HF names by the project's converter."""
    from megatron_rl.model import convert

    grads = {n: p.main_grad.detach().clone() for n, p in policy.module.named_parameters()}
    return convert.megatron_to_hf({convert.shard_key(0, 0, 0, 1): grads}, policy.cfg)


def _our_step(
    policy: Any, cfg: Any, batches: list[Any], norm: float, ref_lp: list[torch.Tensor] | None
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """``train_step`` as the RL loop runs it; the gradient read when it calls optimizer_step."""
    from megatron_rl.train.step import train_step

    seen: dict[str, torch.Tensor] = {}
    real = policy.optimizer_step

    def capture(lr: float) -> dict[str, float]:
        seen.update(_hf_grads(policy))
        return real(lr)

    policy.optimizer_step = capture
    try:
        metrics = train_step(policy, cfg, batches, 0, ref_lp, norm)
    finally:
        del policy.optimizer_step  # the class's method again
    return seen, metrics


def _second_pass(
    policy: Any, cfg: Any, batches: list[Any], norm: float, old_lp: list[torch.Tensor]
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The loss of ``train_step`` over the same batches after the weights moved (one optimizer
    step, or a perturbation), pi_old the policy that scored them. ``train_step`` itself always
    starts from ratio 1 (one optimizer step per batch: pi_old is its own forward pass,
    detached), so the second pass calls ``rl_loss`` through ``Policy.forward_backward`` with
    ``train_step``'s arguments but the stored pi_old."""
    from megatron_rl.losses import rl_loss
    from megatron_rl.packing.batch import to_padded

    def loss_fn(b: Any, logp: torch.Tensor, ent: torch.Tensor) -> tuple[torch.Tensor, dict]:
        pad = lambda x: to_padded(x, b.cu_seqlens)
        loss, m = rl_loss(pad(logp), pad(b.extras["old_lp"]), pad(b.extras["adv"]),
                          pad(b.loss_mask), cfg.rl, norm, rollout_logp=pad(b.extras["rollout_lp"]),
                          entropy=pad(ent))  # fmt: skip
        return loss * policy.dist.dp, m

    for b, old in zip(batches, old_lp, strict=True):
        b.extras["old_lp"] = old.detach().float()
    policy.zero_grad()
    outs = policy.forward_backward(batches, loss_fn)
    grads = _hf_grads(policy)
    policy.zero_grad()
    metrics = {k: sum(o[k] for o in outs) for k in outs[0] if k.startswith("loss")}
    metrics["loss/total"] = metrics.pop("loss")
    return grads, metrics


def _sample_advantages(batches: list[Any], n: int) -> torch.Tensor:
    """Each sample's advantage as the packed batches carry it (on its response tokens)."""
    from megatron_rl.packing.batch import sample_rows

    adv = torch.full((n,), float("nan"))
    for b in batches:
        for sid, rows in sample_rows(b).items():
            on = b.loss_mask[rows] > 0
            vals = b.extras["adv"][rows][on]
            assert torch.all(vals == vals[0])
            adv[sid] = vals[0]
    return adv


def ours(policy: Any, step: dict[str, Any], v: Variant) -> dict[str, Any]:
    from megatron_rl.controller.batches import build_batches
    from megatron_rl.losses import drgrpo_constant, global_normalizer

    cfg = _cfg(v.ours, lr=LR_FIRST_STEP if v.second_pass else 1e-3)
    groups, kept = _groups(step), list(range(len(TASKS)))
    shares, _ = build_batches(groups, kept, cfg.rl.advantage, BUDGET, shared_prefix=True)
    batches = shares[0]
    assert len(batches) >= 2  # the normaliser spans micro-batches
    norm = global_normalizer(
        shares, cfg.rl.loss_agg, drgrpo_constant(cfg.rl, cfg.rollout.max_new_tokens)
    )
    adv = _sample_advantages(batches, len(kept) * N)
    weights = step["perturbed"] if v.perturb else step["hf_sd"]
    ref_lp = None
    try:
        if cfg.rl.kl_coef > 0:  # the reference is tiny-demo-base itself (TRL loads it so)
            ref_lp = [lp for lp, _ in policy.token_logprobs(batches)]
        policy.load_hf_state_dict(weights)
        if v.second_pass:
            old_lp = [lp for lp, _ in policy.token_logprobs(batches)]
            if v.second_pass == "step":
                _our_step(policy, cfg, batches, norm, None)  # the first step, ratio 1
                after = policy.hf_state_dict()
            else:
                after = step["perturbed"]
                policy.load_hf_state_dict(after)
            grads, metrics = _second_pass(policy, cfg, batches, norm, old_lp)
        else:
            after = None
            grads, metrics = _our_step(policy, cfg, batches, norm, ref_lp)
    finally:
        policy.load_hf_state_dict(step["hf_sd"])
        policy.load_optimizer_state(policy.opt0)
    return dict(grads=grads, metrics=metrics, adv=adv, norm=norm, after=after)


# ---------------------------------------------------------------------------------- TRL's side


def trl(step: dict[str, Any], v: Variant, after: dict[str, torch.Tensor] | None = None) -> dict:
    """TRL's loss and gradient for variant ``v`` on the recorded step (TRL's own scoring)."""
    from trl import GRPOTrainer

    weights = step["perturbed"] if v.perturb else step["hf_sd"]
    trainer = GRPOTrainer(
        model=_hf_model(weights),
        reward_funcs=reward,
        args=_trl_args(step["tmp"], **v.trl),
        train_dataset=step["data"],
        processing_class=step["tok"],
    )
    if v.engine_lp:
        # TRL's IS correction needs vLLM's log-probs; the recorded generation brings the
        # "engine's" and TRL's own code computes and applies the ratio (vLLM is not needed)
        trainer.use_vllm = True
        assert trainer.vllm_importance_sampling_correction
        assert trainer.vllm_importance_sampling_clip_min is None
    gen = step["gen_engine"] if v.engine_lp else step["gen"]
    trainer._generate = lambda prompts: gen
    inputs = trainer._generate_and_score_completions(_inputs())
    model = trainer.model
    if after is not None:  # num_iterations=2: the second pass runs on the stepped weights
        assert "old_per_token_logps" in inputs
        model.load_state_dict(after, strict=True)
    model.train()
    model.zero_grad(set_to_none=True)
    trainer.current_gradient_accumulation_steps = 1  # one micro-batch per optimizer step
    loss = trainer.compute_loss(model, inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return dict(grads=grads, loss=float(loss), inputs=inputs, trainer=trainer)


def rel_errors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per tensor: |a - b| / max(|b|, ATOL / RTOL) (Frobenius norms)."""
    assert a.keys() == b.keys()
    return {k: float((a[k] - b[k]).norm()) / max(float(b[k].norm()), ATOL / RTOL) for k in b}


def check_grads(ours_g: dict[str, torch.Tensor], trl_g: dict[str, torch.Tensor]) -> float:
    bad = {}
    for k in trl_g:
        diff, size = float((ours_g[k] - trl_g[k]).norm()), float(trl_g[k].norm())
        if not diff <= RTOL * size + ATOL:
            bad[k] = (diff, size)
    assert not bad, f"gradients differ from TRL's: {bad}"
    assert sum(float(g.norm()) for g in trl_g.values()) > 1e-3  # a real gradient
    return max(rel_errors(ours_g, trl_g).values())


# ---------------------------------------------------------------------------------- tests

MEASURED: dict[str, float] = {}  # variant -> max per-tensor relative error (for the report)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_gradients_match_trl(policy: Any, step: dict[str, Any], name: str) -> None:
    v = VARIANTS[name]
    mine = ours(policy, step, v)
    theirs = trl(step, v, mine["after"])
    adv_trl = theirs["inputs"]["advantages"].float()
    assert float((mine["adv"] - adv_trl).abs().max()) <= ADV_TOL
    assert float(adv_trl.abs().max()) > 0.1
    if v.compare_loss:
        assert mine["metrics"]["loss/total"] == pytest.approx(theirs["loss"], rel=RTOL, abs=1e-6)
    MEASURED[name] = check_grads(mine["grads"], theirs["grads"])
    print(f"\n{name}: max relative error {MEASURED[name]:.2e}")
    m = mine["metrics"]
    if v.second_pass:  # the ratio is away from 1 and the clip bites, on some tokens only
        assert 0.02 < m["loss/clip_frac"] < 0.9, m
        assert abs(m["loss/ratio_mean"] - 1) > 1e-3
        if v.ours.get("dual_clip"):
            assert m["loss/dual_clip_frac"] > 0, m
    if v.engine_lp:
        assert 0.05 < m["loss/tis_clip_frac"] < 0.95, m
    if v.ours.get("kl_coef"):
        assert abs(m["loss/kl"]) > 1e-4


MISMATCHED = {  # our variant, TRL's: each pair differs in one setting
    "seq_mean_ours_vs_dapo": ("seq_mean_token_mean_vs_grpo", "token_mean_vs_dapo"),
    "tis_ours_vs_no_is": ("tis_vs_token_truncate", "token_mean_vs_dapo"),
    "k3_ours_vs_bias_corrected_k3": ("kl_k3", "kl_k2_vs_trl_bias_corrected_k3"),
}


@pytest.mark.parametrize("pair", list(MISMATCHED))
def test_mismatched_setting_does_not_match(policy: Any, step: dict[str, Any], pair: str) -> None:
    """The check has teeth: one setting changed on our side (the aggregation, TIS on, the KL
    estimator) and the same comparison fails, by far more than the tolerance."""
    mine_v, trl_v = (VARIANTS[n] for n in MISMATCHED[pair])
    mine, theirs = ours(policy, step, mine_v), trl(step, trl_v)
    with pytest.raises(AssertionError, match="gradients differ"):
        check_grads(mine["grads"], theirs["grads"])
    assert max(rel_errors(mine["grads"], theirs["grads"]).values()) > 100 * RTOL


AGGS = {  # our rl.loss_agg -> the variant that compares it (its TRL loss_type)
    "token_mean": "token_mean_vs_dapo",
    "seq_mean_token_mean": "seq_mean_token_mean_vs_grpo",
    "seq_mean_token_sum": "seq_mean_token_sum_vs_luspo",
    "seq_mean_token_sum_norm": "drgrpo_vs_dr_grpo",
}


@pytest.mark.parametrize("agg", list(AGGS))
def test_normaliser_matches_trl(policy: Any, step: dict[str, Any], agg: str) -> None:
    """Our step normaliser against TRL's, measured through TRL's loss: advantage -1 on every
    sample makes every token's term 1 at ratio 1, so TRL's loss is (the sum of unit terms our
    aggregation divides) / its normaliser."""
    from megatron_rl.controller.batches import build_batches
    from megatron_rl.losses import drgrpo_constant, global_normalizer

    cfg = _cfg({"loss_agg": agg})
    shares, _ = build_batches(_groups(step), list(range(len(TASKS))), "grpo", BUDGET,
                              shared_prefix=True)  # fmt: skip
    norm = global_normalizer(shares, agg, drgrpo_constant(cfg.rl, cfg.rollout.max_new_tokens))
    theirs = trl(step, VARIANTS[AGGS[agg]])
    inputs = dict(theirs["inputs"])
    inputs["advantages"] = -torch.ones_like(inputs["advantages"])
    with torch.no_grad():
        loss = float(theirs["trainer"].compute_loss(theirs["trainer"].model, inputs))
    mask = inputs["completion_mask"]
    units = float(mask.shape[0]) if agg == "seq_mean_token_mean" else float(mask.sum())
    assert norm == pytest.approx(units / loss, rel=NORM_TOL, abs=0)
    expected = {"token_mean": float(mask.sum()), "seq_mean_token_mean": float(len(mask)),
                "seq_mean_token_sum": float(len(mask)),
                "seq_mean_token_sum_norm": float(len(mask) * MAX_NEW)}  # fmt: skip
    assert norm == expected[agg]


NO_COUNTERPART = {
    "ours_kl_in_reward": "rl.kl_in_reward (KL as a reward penalty): TRL's KL is a loss term only",
    "ours_rloo_passthrough": "rl.advantage rloo / passthrough: GRPOTrainer has group-std or "
    "no scaling only (RLOO is TRL's RLOOTrainer)",
    "trl_scale_rewards_batch": "TRL scale_rewards=batch (batch std): our advantages are per group",
    "trl_sequence_and_mask_is": "TRL vllm_importance_sampling_mode sequence_*/token_mask and "
    "clip_min: our TIS is per token, truncated from above only (token_truncate, clip_min None)",
    "trl_mask_truncated_completions": "TRL mask_truncated_completions: we train truncated "
    "completions (the length penalty, if any, is the reward's)",
    "trl_top_entropy_quantile": "TRL top_entropy_quantile < 1: no entropy-quantile token mask",
    "trl_cispo_sapo_vespo": "TRL loss_type cispo / sapo / vespo and off_policy_mask_threshold",
    "trl_entropy_bonus_seq_mean": "TRL's entropy bonus is a token mean whatever loss_type; ours "
    "follows rl.loss_agg (equal under token_mean, tested above)",
}


@pytest.mark.parametrize("name", list(NO_COUNTERPART))
def test_no_trl_counterpart(name: str) -> None:
    pytest.skip(f"no counterpart: {NO_COUNTERPART[name]}")


def test_first_pass_is_ratio_one(policy: Any, step: dict[str, Any]) -> None:
    """What TRL's ``num_iterations=1`` and our ``train_step`` share: pi_old is the step's own
    policy, so the ratio is exactly 1 and clipping never bites on the only pass."""
    mine = ours(policy, step, Variant({**SECOND, "dual_clip": 1.3}, {}))
    m = mine["metrics"]
    assert m["loss/ratio_mean"] == pytest.approx(1.0, abs=1e-7)
    assert m["loss/clip_frac"] == 0 and m["loss/dual_clip_frac"] == 0
    assert math.isfinite(m["train/grad_norm"]) and m["train/grad_norm"] > 0


def test_logprobs_match_trl_under_left_padding(policy: Any, step: dict[str, Any]) -> None:
    """TRL left-pads the prompts and passes no position ids, so a shorter prompt's tokens sit at
    positions shifted by its padding; RoPE sees only relative positions, so the log-probs equal
    ours (positions from 0 in every sample) to fp32 rounding."""
    from megatron_rl.controller.batches import build_batches
    from megatron_rl.packing.batch import sample_rows

    shares, _ = build_batches(_groups(step), list(range(len(TASKS))), "grpo", BUDGET,
                              shared_prefix=True)  # fmt: skip
    mine = torch.full((len(TASKS) * N, MAX_NEW), float("nan"))
    for b, (lp, _) in zip(shares[0], policy.token_logprobs(shares[0]), strict=True):
        for sid, rows in sample_rows(b).items():
            vals = lp[rows][b.loss_mask[rows] > 0]
            mine[sid, : len(vals)] = vals
    theirs = trl(step, VARIANTS["token_mean_vs_dapo"])
    inputs, trainer = theirs["inputs"], theirs["trainer"]
    pads = (inputs["prompt_mask"] == 0).sum(1)
    assert len(set(pads.tolist())) >= 3  # prompts shifted by different amounts
    with torch.no_grad():
        lp, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1),
            inputs["completion_ids"].size(1),
        )
    on = inputs["completion_mask"].bool()
    width = on.shape[1]
    assert float((mine[:, :width][on] - lp[on]).abs().max()) < 1e-4
