"""Format / instruction-following domains: rule-checked constraints on the shape of the answer.

Every domain here checks rules, not content quality: a JSON object valid under a JSON Schema,
an exact word count, required Markdown sections in order, bullet lists, a casing rewrite. Each
task also names a topic word that must appear, so a constraint cannot be met by an unrelated
canned text (and garbage never scores). The answer is the ``<answer>`` block if present, else
the whole response; ``json_schema`` also accepts a fenced ```json block.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import jsonschema

from megatron_rl.domains.base import Domain, Task, extract_answer

TOPICS = [
    "river",
    "garden",
    "comet",
    "violin",
    "harbor",
    "glacier",
    "lantern",
    "orchard",
    "bakery",
    "compass",
    "meadow",
    "library",
    "volcano",
    "tram",
    "falcon",
    "quarry",
]
FILLER = ["the", "quiet", "old", "bright", "small", "morning", "near", "always", "green", "calm"]
SECTIONS = ["Summary", "Background", "Method", "Risks", "Timeline", "Budget", "Outcome"]
_JSON_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)```", re.DOTALL)


def _sentence(rng: random.Random, topic: str, n: int) -> str:
    words = [rng.choice(FILLER) for _ in range(n - 1)]
    words.insert(rng.randrange(n), topic)
    return " ".join(words).capitalize() + "."


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z0-9']+", text)


class FormatDomain(Domain):
    family = "format"
    levels = (1, 2, 3)
    time_budget_s = 1.0

    def __init__(self, rule: str) -> None:
        self.rule = rule
        self.name = f"format/{rule}"
        self.tags = ("format", "instruction_following")
        self.tier = "core" if rule in ("json_schema", "word_count") else "long_tail"

    def extract(self, task: Task, response: str) -> str:
        if self.rule == "json_schema":
            fences = _JSON_FENCE.findall(response)
            if fences:
                return str(fences[-1]).strip()
        return extract_answer(response, multiline=True)

    def generate(self, level: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        topic = rng.choice(TOPICS)
        return getattr(self, f"_gen_{self.rule}")(level, rng, topic)

    def score(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        ok, reason = getattr(self, f"_check_{self.rule}")(task, answer)
        return float(ok), {"reason": reason}

    # -- json_schema -------------------------------------------------------------------------
    def _gen_json_schema(self, level: int, rng: random.Random, topic: str) -> tuple[str, str, dict]:
        n_tags, lo = rng.randint(1, 2 + level), rng.randint(1, 50)
        schema = {
            "type": "object",
            "required": ["topic", "count", "tags"],
            "additionalProperties": level < 3,
            "properties": {
                "topic": {"const": topic},
                "count": {"type": "integer", "minimum": lo, "maximum": lo + 9},
                "tags": {
                    "type": "array",
                    "items": {"type": "string"},
                    "minItems": n_tags,
                    "maxItems": n_tags,
                },
            },
        }
        gold = json.dumps(
            {
                "topic": topic,
                "count": lo + rng.randint(0, 9),
                "tags": [rng.choice(FILLER) for _ in range(n_tags)],
            }
        )
        prompt = (
            f"Reply with only a JSON object valid under this JSON Schema:\n{json.dumps(schema)}"
        )
        return prompt, gold, {"schema": schema}

    def _check_json_schema(self, task: Task, answer: str) -> tuple[bool, str]:
        try:
            jsonschema.validate(json.loads(answer), task.meta["schema"])
        except (ValueError, jsonschema.ValidationError) as e:
            return False, str(e).split("\n", 1)[0][:200]
        return True, "valid"

    # -- word_count --------------------------------------------------------------------------
    def _gen_word_count(self, level: int, rng: random.Random, topic: str) -> tuple[str, str, dict]:
        n = rng.randint(4, 6 * level + 6)
        prompt = f"Write one sentence about a {topic} using exactly {n} words."
        return prompt, _sentence(rng, topic, n), {"n": n, "topic": topic}

    def _check_word_count(self, task: Task, answer: str) -> tuple[bool, str]:
        words = _words(answer)
        if task.meta["topic"] not in (w.lower() for w in words):
            return False, "topic word missing"
        return len(words) == task.meta["n"], f"{len(words)} words, wanted {task.meta['n']}"

    # -- sections ----------------------------------------------------------------------------
    def _gen_sections(self, level: int, rng: random.Random, topic: str) -> tuple[str, str, dict]:
        names = rng.sample(SECTIONS, level + 1)
        prompt = (
            f"Write a short note about a {topic} with exactly these Markdown sections in "
            f"this order, each a '## ' heading followed by at least one sentence: "
            f"{', '.join(names)}. Mention the {topic}."
        )
        gold = "\n\n".join(f"## {s}\n{_sentence(rng, topic, 6)}" for s in names)
        return prompt, gold, {"sections": names, "topic": topic}

    def _check_sections(self, task: Task, answer: str) -> tuple[bool, str]:
        parts = re.split(r"^##[ \t]+(.+?)[ \t]*$", answer, flags=re.MULTILINE)
        headings, bodies = parts[1::2], parts[2::2]
        if [h.strip() for h in headings] != task.meta["sections"]:
            return False, f"headings {headings[:8]} != {task.meta['sections']}"
        if any(not _words(b) for b in bodies):
            return False, "empty section"
        return task.meta["topic"] in answer.lower(), "sections ok"

    # -- bullets -----------------------------------------------------------------------------
    def _gen_bullets(self, level: int, rng: random.Random, topic: str) -> tuple[str, str, dict]:
        n = rng.randint(2, 3 * level + 2)
        prompt = (
            f"List exactly {n} bullet points, each line starting with '- ' and each "
            f"containing the word '{topic}'. No other lines."
        )
        gold = "\n".join(f"- {_sentence(rng, topic, 5)}" for _ in range(n))
        return prompt, gold, {"n": n, "topic": topic}

    def _check_bullets(self, task: Task, answer: str) -> tuple[bool, str]:
        lines = [ln for ln in answer.strip().splitlines() if ln.strip()]
        if len(lines) != task.meta["n"] or not all(ln.startswith("- ") for ln in lines):
            return False, f"{len(lines)} lines, wanted {task.meta['n']} bullets"
        return all(task.meta["topic"] in ln.lower() for ln in lines), "bullets ok"

    # -- uppercase ---------------------------------------------------------------------------
    def _gen_uppercase(self, level: int, rng: random.Random, topic: str) -> tuple[str, str, dict]:
        text = " ".join(_sentence(rng, topic, rng.randint(4, 8)) for _ in range(level))
        return f"Rewrite this text in capital letters only, nothing else:\n{text}", text.upper(), {}

    def _check_uppercase(self, task: Task, answer: str) -> tuple[bool, str]:
        ok = " ".join(answer.split()) == task.gold
        return ok, "exact match after whitespace normalisation"


RULES = ("json_schema", "word_count", "sections", "bullets", "uppercase")


def domains() -> list[Domain]:
    return [FormatDomain(r) for r in RULES]
