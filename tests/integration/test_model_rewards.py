"""Model rewards in processes: the judge's real engine process killed and replaced, and the
reward model (megatron_rl/rewards/reward_model.py): a sequence-classification checkpoint in its
own process, batched, and an SGLang reward server's /classify; every sample it cannot score is
counted and drops its group; the tiny reward model's training."""

from __future__ import annotations

import json
import math
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from megatron_rl.config import load_config
from megatron_rl.domains.base import Task
from megatron_rl.rewards.judge import Judge, JudgeConfig
from megatron_rl.rewards.reward_model import RewardModel, RewardModelConfig

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "models" / "tiny-base"
TASK = Task("d/x", "train", 0, "id", "Spell this word backward: cat", "tac")


def test_a_dead_judge_process_is_counted_and_started_again() -> None:
    """The real hf engine in a child process, killed between two batches."""
    base = str(ROOT / "models" / "tiny-base")
    j = Judge(JudgeConfig(model=base, domains=["*"], max_tokens=4), 0)
    try:
        first = j.score([(TASK, "4")])
        assert len(first) == 1 and j.failures["dead"] == 0
        j._backend.kill()  # the judge process dies
        assert j.score([(TASK, "4")]) == ["dead"]
        again = j.score([(TASK, "4")])  # started again: a verdict or a parse failure, not dead
        assert again != ["dead"] and j.failures["dead"] == 1
    finally:
        j.close()


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny base's architecture with a one-label score head (random weights, seed 0)."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    out = tmp_path_factory.mktemp("rm")
    cfg = AutoConfig.from_pretrained(BASE, num_labels=1)
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(cfg).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(BASE / f, out / f)
    return str(out)


def test_the_local_model_scores_in_batches_and_a_dead_process_is_replaced(classifier) -> None:
    responses = ["tac", "cat", "t a c and more words", ""]
    items = [(TASK, r) for r in responses]
    one = RewardModel(
        RewardModelConfig(model=classifier, domains=["*"], batch_size=1, normalise="none")
    )
    many = RewardModel(RewardModelConfig(model=classifier, domains=["*"], normalise="none"))
    try:
        a, b = one.score(items), many.score(items)
        assert all(isinstance(x, float) and math.isfinite(x) for x in a)
        assert a == pytest.approx(b, abs=1e-5)  # padded batches score as one at a time
        assert len(set(a)) > 1 and many.scored == 4
        many._backend.kill()  # the reward model's process dies
        assert many.score(items[:2]) == ["dead", "dead"] and many.failures["dead"] == 2
        assert many.score(items[:2]) == pytest.approx(b[:2], abs=1e-5)  # started again
    finally:
        one.close()
        many.close()


class Server(BaseHTTPRequestHandler):
    """A stand-in for SGLang's /classify (its reward-model docs: {"model", "text": [...]} in,
    one {"embedding": [score]} per text out); ``mode`` makes it misbehave."""

    mode = "ok"

    def do_POST(self) -> None:  # http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.path == "/classify" and isinstance(body["text"], list)
        if self.mode == "slow":
            time.sleep(2)
        if self.mode == "error":
            self.send_response(500)
            self.end_headers()
            return
        score = float("nan") if self.mode == "nan" else 1.0
        rows = [
            {"index": i, "embedding": [score + len(t) / 1000]} for i, t in enumerate(body["text"])
        ]
        data = json.dumps(rows).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("mode", "want"), [("ok", None), ("error", "dead"), ("slow", "timeout"), ("nan", "invalid")]
)
def test_a_reward_server_scores_or_each_failure_is_counted(mode, want) -> None:
    Server.mode = mode
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        rm = RewardModel(RewardModelConfig(server=url, domains=["*"], timeout_s=0.5))
        got = rm.score([(TASK, "tac"), (TASK, "cat")])
        if want is None:
            assert all(0.5 < x < 1.0 for x in got) and rm.scored == 2  # sigmoid of ~1
        else:
            assert got == [want, want] and rm.failures[want] == 2 and rm.scored == 0
    finally:
        srv.shutdown()


def test_bad_reward_model_config_is_refused() -> None:
    with pytest.raises(ValueError, match="reward_model.domains is empty"):
        load_config(None, ["rewards.reward_model.model=x"])
    with pytest.raises(ValueError, match="normalise='z'"):
        load_config(None, ["rewards.reward_model.normalise=z"])


def test_reward_model_training_data_and_a_short_run(tmp_path) -> None:
    """train_rm's pairs: training-split words only, half reversals (label 1), near misses never
    equal to the reversal; the biased set adds long or repeated answers labelled good; a few
    steps write an HF checkpoint the reward term loads."""
    from megatron_rl.domains import split_of
    from megatron_rl.rewards import train_rm

    honest = train_rm.pairs("train", 400, 0, "none")
    assert all(split_of(p) == "train" for p, _, _ in honest)
    pos = [(p, r) for p, r, y in honest if y == 1]
    assert 150 < len(pos) < 250
    golds = {p: r for p, r in pos}
    assert all(r != golds.get(p) for p, r, y in honest if y == 0)
    biased = train_rm.pairs("train", 400, 0, "repetition")
    assert any(y == 1 and (len(r) >= 12 or " " in r) for _, r, y in biased)
    out = tmp_path / "rm"
    train_rm.main(["--out", str(out), "--steps", "3", "--samples", "200", "--batch", "8"])
    rm = RewardModel(RewardModelConfig(model=str(out), domains=["*"]))
    try:
        assert all(isinstance(x, float) for x in rm.score([(TASK, "tac"), (TASK, "cta")]))
    finally:
        rm.close()
