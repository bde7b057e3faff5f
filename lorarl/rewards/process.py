"""Process rewards: one deposit per reasoning step, scored by a process reward model (PRM).

Steps are the pieces of a completion between separators (default ``"\\n"``, as paper 001). A step's
deposit sits on the token that *closes* it: the token holding the separator's last character, or the
last completion token for the final piece. Empty pieces (two separators in a row) deposit nothing.
The PRM sees the question (the prompt) and the steps, never the gold answer.

Two scorers:
* :class:`RuleStepChecker`, for the synthetic arithmetic task: each step line such as ``23+45=68`` is
  checked exactly with a small recursive-descent parser over integers/fractions (``+ - * / ( )``);
  nothing is ever ``eval``-ed. ``\\boxed{v}`` lines score 1 when v repeats the previous step's result.
  ``mode="chain"`` additionally requires the k-th step to be the k-th step of the question's chain.
* :class:`ShepherdPRM`, a Hugging Face causal LM in the Math-Shepherd style: the question and the
  steps joined with a step tag (``"ки"``), score = P(good | good or bad) at each tag position.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any, Literal, Protocol, Sequence

from pydantic import Field, model_validator

from lorarl.rewards import Deposits, ExtraModel, Rollouts, register_regime
from lorarl.rewards.section import RewardSection


class ProcessSection(RewardSection):
    """``reward:`` of ``regime: process``: how steps are split and which PRM scores them."""

    step_separator: str = Field("\n", min_length=1)  # a step ends at this string (paper 001: newline)
    prm: Literal["rule", "hf"] = "rule"  # synthetic-task step checker, or a Math-Shepherd-style HF PRM
    rule_check: Literal["arithmetic", "chain"] = "arithmetic"  # rule PRM: any true equation, or the question's chain
    prm_model: str | None = None  # hf PRM: model id or path (e.g. peiyi9979/math-shepherd-mistral-7b-prm)
    prm_step_tag: str = "ки"  # hf PRM: tag written after each step; the step is scored at its position
    prm_good_token: str = "+"  # hf PRM: label token whose probability is the step's score
    prm_bad_token: str = "-"  # hf PRM: the competing label token
    prm_device: str | None = None  # hf PRM: device (None = the policy's)
    prm_batch_size: int = Field(8, gt=0, json_schema_extra={"runtime": True})  # hf PRM: sequences per forward (memory, not results)
    prm_max_length: int | None = Field(None, gt=0)  # hf PRM: input truncation (steps past it score 0, counted)

    @model_validator(mode="after")
    def _names_its_prm(self) -> "ProcessSection":
        if self.prm == "hf" and not self.prm_model:
            raise ValueError("reward.prm_model is required when reward.prm is 'hf'")
        return self


# ----------------------------------------------------------------------------- step splitting
def split_steps(token_texts: Sequence[str], separator: str = "\n") -> list[tuple[int, int, str]]:
    """``(first_token, closing_token, text)`` for every non-empty step of one completion.

    ``token_texts`` are the completion's tokens decoded one by one ('' for special tokens).
    """
    if not separator:
        raise ValueError("the step separator must be a non-empty string")
    text = "".join(token_texts)
    owner = [i for i, t in enumerate(token_texts) for _ in t]  # char index -> token index
    steps: list[tuple[int, int, str]] = []
    start = 0
    while True:
        hit = text.find(separator, start)
        end = len(text) if hit < 0 else hit
        piece = text[start:end]
        if piece.strip():
            first = owner[start]
            close = owner[hit + len(separator) - 1] if hit >= 0 else len(token_texts) - 1
            steps.append((first, close, piece.strip()))
        if hit < 0:
            break
        start = hit + len(separator)
    return steps


# ----------------------------------------------------------------------------- safe arithmetic
class ParseError(ValueError):
    pass


_NUM = re.compile(r"\d+(?:\.\d+)?")
_MAX_CHARS = 200  # longer "equations" are not steps we score
_MAX_DIGITS = 30  # bounded numbers: no giant-integer blow-ups


def parse_arith(expr: str) -> Fraction:
    """Value of an arithmetic expression over + - * / ( ) and decimal numbers. Never evaluates code."""
    s = expr.replace(" ", "").replace("×", "*").replace("−", "-").replace("÷", "/")
    if not s or len(s) > _MAX_CHARS:
        raise ParseError("empty or too long")
    pos = 0

    def peek() -> str:
        return s[pos] if pos < len(s) else ""

    def number() -> Fraction:
        nonlocal pos
        m = _NUM.match(s, pos)
        if not m or len(m.group()) > _MAX_DIGITS:
            raise ParseError(f"number expected at {pos}")
        pos = m.end()
        return Fraction(m.group())

    def atom(depth: int) -> Fraction:
        nonlocal pos
        if depth > 20:
            raise ParseError("nested too deep")
        c = peek()
        if c == "-":
            pos += 1
            return -atom(depth + 1)
        if c == "+":
            pos += 1
            return atom(depth + 1)
        if c == "(":
            pos += 1
            v = sum_(depth + 1)
            if peek() != ")":
                raise ParseError("unbalanced parenthesis")
            pos += 1
            return v
        return number()

    def product(depth: int) -> Fraction:
        nonlocal pos
        v = atom(depth)
        while peek() in ("*", "/") and peek():
            op = s[pos]
            pos += 1
            rhs = atom(depth)
            if op == "*":
                v *= rhs
            else:
                if rhs == 0:
                    raise ParseError("division by zero")
                v /= rhs
        return v

    def sum_(depth: int) -> Fraction:
        nonlocal pos
        v = product(depth)
        while peek() in ("+", "-") and peek():
            op = s[pos]
            pos += 1
            rhs = product(depth)
            v = v + rhs if op == "+" else v - rhs
        return v

    value = sum_(0)
    if pos != len(s):
        raise ParseError(f"unexpected {s[pos]!r} at {pos}")
    return value


def check_equation(line: str) -> tuple[bool, Fraction | None]:
    """``(correct, rhs value)`` for a line ``lhs = rhs``; ``(False, None)`` when it is not one."""
    if line.count("=") != 1:
        return False, None
    lhs, rhs = line.split("=")
    try:
        left, right = parse_arith(lhs), parse_arith(rhs)
    except ParseError:
        return False, None
    return left == right, right


_BOXED_LINE = re.compile(r"^\\boxed\{([^{}]*)\}$")
_QUESTION = re.compile(r"Q:\s*([0-9+\-\s]+?)\s*=\s*\?")


def chain_steps(question: str) -> list[str] | None:
    """The reference step lines of a synthetic question ``Q: 23+45-17=?`` (None if not one)."""
    m = _QUESTION.search(question)
    if not m:
        return None
    toks = re.findall(r"\d+|[+-]", m.group(1).replace(" ", ""))
    if len(toks) < 3 or len(toks) % 2 == 0:
        return None
    acc, steps = int(toks[0]), []
    for op, x in zip(toks[1::2], toks[2::2]):
        new = acc + int(x) if op == "+" else acc - int(x)
        steps.append(f"{acc}{op}{x}={new}")
        acc = new
    return steps


class StepScorer(Protocol):
    def score(self, questions: list[str], steps: list[list[str]]) -> list[list[float]]: ...


class RuleStepChecker:
    """Exact step checker for the synthetic task (a perfect, rule-based PRM). Scores are 0 or 1.

    ``mode="arithmetic"``: a step is good when it is a true equation (or a boxed line repeating the
    previous result). Any true equation counts, so emitting extra true steps earns reward: the same
    length-hacking incentive paper 001 reports for its PRM. ``mode="chain"``: the k-th step must also
    be the k-th step of the question's own chain (reads the prompt, never the gold answer).
    """

    def __init__(self, mode: str = "arithmetic"):
        if mode not in ("arithmetic", "chain"):
            raise ValueError(f"unknown rule_check mode {mode!r}; allowed: arithmetic, chain")
        self.mode = mode

    def score_one(self, question: str, steps: list[str]) -> list[float]:
        ref = chain_steps(question) if self.mode == "chain" else None
        out, last = [], None
        n_eq = 0
        for step in steps:
            line = step.strip()
            boxed = _BOXED_LINE.match(line)
            if boxed:
                try:
                    ok = last is not None and parse_arith(boxed.group(1)) == last
                except ParseError:
                    ok = False
                out.append(1.0 if ok else 0.0)
                continue
            ok, value = check_equation(line)
            if ok and ref is not None:
                ok = n_eq < len(ref) and line.replace(" ", "") == ref[n_eq]
            n_eq += 1
            last = value if ok else None
            out.append(1.0 if ok else 0.0)
        return out

    def score(self, questions: list[str], steps: list[list[str]]) -> list[list[float]]:
        return [self.score_one(q, s) for q, s in zip(questions, steps)]


class ShepherdPRM:
    """A Math-Shepherd-style PRM: a causal LM reading ``question step1 <tag>\\nstep2 <tag>...``.

    The score of step k is ``softmax(logits[tag_k, [good, bad]])[good]`` at the k-th tag position
    (the token that predicts the label). Batches are right-padded; a step whose tag falls beyond
    ``max_length`` scores 0.0 and is counted in ``self.truncated_steps``.
    """

    def __init__(self, model: Any, tokenizer: Any, step_tag: str = "ки", good_token: str = "+",
                 bad_token: str = "-", device: str = "cpu", batch_size: int = 8, max_length: int | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.step_tag, self.device = step_tag, device
        self.batch_size, self.max_length = batch_size, max_length
        tag_ids = tokenizer.encode(step_tag, add_special_tokens=False)
        self.tag_id = tag_ids[-1]
        self.label_ids = [self._single_token(good_token), self._single_token(bad_token)]
        self.truncated_steps = 0

    def _single_token(self, text: str) -> int:
        for variant in (text, " " + text):
            ids = self.tokenizer.encode(variant, add_special_tokens=False)
            if len(ids) == 1:
                return ids[0]
        raise ValueError(f"PRM label {text!r} is not a single token of the PRM's tokenizer")

    @classmethod
    def load(cls, model_id: str, *, device: str = "cpu", dtype: str = "auto", **kw) -> "ShepherdPRM":
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not model_id:
            raise ValueError("reward.prm_model is required for the Hugging Face PRM backend")
        tok = AutoTokenizer.from_pretrained(model_id)
        torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
        model = AutoModelForCausalLM.from_pretrained(model_id, dtype=torch_dtype).to(device).eval()
        model.requires_grad_(False)
        return cls(model, tok, device=device, **kw)

    def format(self, question: str, steps: list[str]) -> str:
        clean = [s.replace(self.step_tag, "").strip() for s in steps]
        return f"{question.strip()} " + "\n".join(f"{s} {self.step_tag}" for s in clean)

    def score(self, questions: list[str], steps: list[list[str]]) -> list[list[float]]:
        import torch

        out: list[list[float]] = [[] for _ in questions]
        todo = [i for i, s in enumerate(steps) if s]
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        for k in range(0, len(todo), self.batch_size):
            rows = todo[k:k + self.batch_size]
            enc = [self.tokenizer.encode(self.format(questions[i], steps[i]), add_special_tokens=True)
                   for i in rows]
            if self.max_length:
                enc = [e[: self.max_length] for e in enc]
            width = max(len(e) for e in enc)
            ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
            attn = torch.zeros((len(rows), width), dtype=torch.long)
            for j, e in enumerate(enc):
                ids[j, : len(e)] = torch.tensor(e)
                attn[j, : len(e)] = 1
            with torch.no_grad():
                logits = self.model(input_ids=ids.to(self.device), attention_mask=attn.to(self.device)).logits
            probs = logits[..., self.label_ids].float().softmax(-1)[..., 0].cpu()
            for j, i in enumerate(rows):
                tag_pos = [p for p, t in enumerate(enc[j]) if t == self.tag_id]
                n = len(steps[i])
                if len(tag_pos) > n:
                    raise ValueError("the PRM step tag is split or merged by its tokenizer: "
                                     f"{len(tag_pos)} tag tokens for {n} steps")
                scores = [float(probs[j, p]) for p in tag_pos]
                if len(scores) < n:
                    if not self.max_length or len(enc[j]) < self.max_length:
                        raise ValueError(f"PRM step tag {self.step_tag!r} is not one token of its tokenizer")
                    self.truncated_steps += n - len(scores)
                    scores += [0.0] * (n - len(scores))
                out[i] = scores
        return out


class ProcessDeposits:
    """The ``process`` regime: one deposit per step, on the step's closing token."""

    name = "process"
    needs_student_logps = False
    needs_gold = False  # the PRM never sees the gold answer
    reports_accuracy = False  # step scores are no grade: the trainer grades the answers for the metric

    def __init__(self, scorer: StepScorer, separator: str = "\n", tokenizer: Any = None):
        self.scorer, self.separator, self.tokenizer = scorer, separator, tokenizer

    def deposits(self, rollouts: Rollouts) -> Deposits:
        if not rollouts.token_texts:
            raise ValueError("the process regime needs Rollouts.token_texts")
        spans = [split_steps(t, self.separator) for t in rollouts.token_texts]
        texts = [[self._text(ids, a, b, t) for a, b, t in sp] for ids, sp in zip(rollouts.completion_ids, spans)]
        # The PRM gets the question and the steps only: the gold answer is never passed on.
        scores = self.scorer.score(list(rollouts.prompts), texts)
        positions = [[b for _, b, _ in sp] for sp in spans]
        return Deposits(positions, [list(map(float, s)) for s in scores], dense=False)

    def _text(self, ids: list[int], first: int, close: int, joined: str) -> str:
        """The step's text from the per-token texts; re-decoded when a multi-byte character was split."""
        if "\ufffd" not in joined or self.tokenizer is None:
            return joined
        text = self.tokenizer.decode(ids[first:close + 1], skip_special_tokens=True)
        return text.strip().strip(self.separator).strip() or joined


def extra_models(cfg: Any) -> list[ExtraModel]:
    """The HF backend's PRM (the rule checker loads nothing); a hub id or path, never a local recipe."""
    if cfg.prm != "hf":
        return []
    return [ExtraModel("prm", "reward.prm_model", cfg.prm_model, "auto", cfg.prm_batch_size, local_recipe=False, device_field="prm_device")]


@register_regime("process", section=ProcessSection, extra_models=extra_models)
def build(cfg: Any, tokenizer: Any, *, resolve: Any = None, device: str = "cpu",
          temperature: float = 1.0) -> ProcessDeposits:
    """``reward.regime: process``: the rule step checker, or a Math-Shepherd-style PRM (loaded here)."""
    if cfg.prm == "rule":
        scorer: StepScorer = RuleStepChecker(mode=cfg.rule_check)
    else:
        scorer = ShepherdPRM.load(cfg.prm_model, step_tag=cfg.prm_step_tag, good_token=cfg.prm_good_token,
                                  bad_token=cfg.prm_bad_token, device=cfg.prm_device or device,
                                  batch_size=cfg.prm_batch_size, max_length=cfg.prm_max_length)
    return ProcessDeposits(scorer, separator=cfg.step_separator, tokenizer=tokenizer)
