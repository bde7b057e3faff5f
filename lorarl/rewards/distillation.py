"""On-policy distillation reward: a deposit on every completion token,
``r_t = log pi_T(o_t | s_t) - log pi_theta(o_t | s_t)`` (the teacher scoring the student's exact tokens).

Teacher and student must share a tokenizer (same vocabulary, same ids): :func:`check_shared_tokenizer`
fails clearly otherwise. The teacher is any causal LM path/id on its own device (``cuda:1`` on a
cluster, the CPU here); both log-probabilities are taken at the rollout temperature, so the reward
is the per-token reverse-KL integrand between the two sampling distributions.
"""

from __future__ import annotations

from typing import Any, Callable

from pydantic import Field, model_validator

from lorarl.rewards import Deposits, ExtraModel, Rollouts, register_regime
from lorarl.rewards.section import RewardSection


class DistillationSection(RewardSection):
    """``reward:`` of ``regime: distillation``: the teacher that scores the student's tokens."""

    teacher: str | None = None  # `local:<recipe>`, HF id or path; must share the student's tokenizer (required)
    teacher_device: str | None = None  # e.g. "cuda:1" (None = the policy's)
    teacher_dtype: str = "auto"  # dtype of the teacher's weights
    teacher_batch_size: int = Field(8, gt=0, json_schema_extra={"runtime": True})  # sequences per teacher forward (memory, not results)

    @model_validator(mode="after")
    def _names_its_teacher(self) -> "DistillationSection":
        if not self.teacher:
            raise ValueError("reward.teacher is required when reward.regime is 'distillation'")
        return self

_PROBES = ["Q: 23+45-17=?\nA: 23+45=68\n68-17=51\n\\boxed{51}",
           "Let $x^2 + 3x = 10$. Then $x = 2$ or $x = -5$.", "  leading spaces\tand tabs\n\nünïcödé 数学"]


def check_shared_tokenizer(student: Any, teacher: Any, teacher_name: str = "teacher") -> None:
    """Raise ValueError unless both tokenizers map the same strings to the same ids."""
    sv, tv = student.get_vocab(), teacher.get_vocab()
    if sv != tv:
        only_s = sorted(set(sv) - set(tv))[:5]
        only_t = sorted(set(tv) - set(sv))[:5]
        moved = sorted(k for k in set(sv) & set(tv) if sv[k] != tv[k])[:5]
        raise ValueError(
            f"the distillation teacher {teacher_name!r} does not share the student's tokenizer "
            f"(vocab sizes {len(sv)} vs {len(tv)}; student-only tokens {only_s}, teacher-only {only_t}, "
            f"different ids {moved}): the teacher must score the student's exact tokens")
    for text in _PROBES:
        a = student.encode(text, add_special_tokens=False)
        b = teacher.encode(text, add_special_tokens=False)
        if a != b:
            raise ValueError(f"the distillation teacher {teacher_name!r} tokenizes {text!r} differently "
                             f"from the student ({a[:12]}... vs {b[:12]}...)")


class TeacherScorer:
    """Per-token log-probabilities of given completions under a frozen teacher LM."""

    def __init__(self, model: Any, device: str = "cpu", batch_size: int = 8, temperature: float = 1.0,
                 pad_token_id: int = 0):
        from trl.trainer.utils import add_fused_lm_head

        self.model, self.device = model, device
        self.batch_size, self.temperature, self.pad_token_id = batch_size, temperature, pad_token_id
        self.model.requires_grad_(False)
        self.model.eval()
        # Log-probs of the labelled tokens in tiles, without materialising [B, L, vocab] logits
        add_fused_lm_head(self.model, temperature=temperature)

    @classmethod
    def load(cls, path: str, *, student_tokenizer: Any, device: str = "cpu", dtype: str = "auto",
             batch_size: int = 8, temperature: float = 1.0) -> "TeacherScorer":
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not path:
            raise ValueError("reward.teacher is required for the distillation regime")
        check_shared_tokenizer(student_tokenizer, AutoTokenizer.from_pretrained(path), path)
        torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device)
        pad = student_tokenizer.pad_token_id if student_tokenizer.pad_token_id is not None else 0
        return cls(model, device=device, batch_size=batch_size, temperature=temperature, pad_token_id=pad)

    def logps(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        """``log pi_T(o_t | prompt, o_<t)`` for every completion token (left-padded prompts)."""
        import torch

        out: list[list[float]] = []
        for k in range(0, len(prompt_ids), self.batch_size):
            ps, cs = prompt_ids[k:k + self.batch_size], completion_ids[k:k + self.batch_size]
            pw, cw = max(len(p) for p in ps), max(max(len(c) for c in cs), 1)
            ids = torch.full((len(ps), pw + cw), self.pad_token_id, dtype=torch.long)
            attn = torch.zeros_like(ids)
            labels = torch.full_like(ids, -100)
            for j, (p, c) in enumerate(zip(ps, cs)):
                ids[j, pw - len(p):pw] = torch.tensor(p, dtype=torch.long)
                attn[j, pw - len(p):pw] = 1
                if c:
                    ids[j, pw:pw + len(c)] = torch.tensor(c, dtype=torch.long)
                    attn[j, pw:pw + len(c)] = 1
                    labels[j, pw:pw + len(c)] = torch.tensor(c, dtype=torch.long)
            with torch.no_grad():
                res = self.model(input_ids=ids.to(self.device), attention_mask=attn.to(self.device),
                                 labels=labels.to(self.device), fused_lm_head=True)
            lp = res.log_probs[:, -cw:].float().cpu()  # position t scores label t (shifted inside)
            out.extend(lp[j, : len(c)].tolist() for j, c in enumerate(cs))
        return out


class DistillationDeposits:
    """The ``distillation`` regime: dense deposits ``log pi_T - log pi_theta`` on every token."""

    name = "distillation"
    needs_student_logps = True
    needs_gold = False  # the teacher scores tokens, not answers
    reports_accuracy = False  # log-ratios are no grade: the trainer grades the answers for the metric

    def __init__(self, teacher: TeacherScorer):
        self.teacher = teacher

    def deposits(self, rollouts: Rollouts) -> Deposits:
        if rollouts.student_logps is None:
            raise ValueError("the distillation regime needs Rollouts.student_logps")
        teacher = self.teacher.logps(rollouts.prompt_ids, rollouts.completion_ids)
        positions, values = [], []
        for ids, t, s in zip(rollouts.completion_ids, teacher, rollouts.student_logps):
            n = len(ids)
            positions.append(list(range(n)))
            values.append([float(a - b) for a, b in zip(t[:n], s[:n])])
        return Deposits(positions, values, dense=True)


def extra_models(cfg: Any) -> list[ExtraModel]:
    """The teacher (a `local:<recipe>` teacher is built by the workflow first)."""
    if not cfg.teacher:
        return []
    return [ExtraModel("teacher", "reward.teacher", cfg.teacher, cfg.teacher_dtype, cfg.teacher_batch_size,
                       local_recipe=True, device_field="teacher_device")]


@register_regime("distillation", section=DistillationSection, extra_models=extra_models)
def build(cfg: Any, tokenizer: Any, *, resolve: Callable[[str], str] | None = None, device: str = "cpu",
          temperature: float = 1.0) -> DistillationDeposits:
    """``reward.regime: distillation``: the teacher (``reward.teacher``, loaded here) scores the student's tokens;
    ``resolve``: where a `local:<recipe>` teacher was built (lorarl.rewards.registry.build_regime)."""
    path = resolve(cfg.teacher) if resolve is not None and cfg.teacher else cfg.teacher
    teacher = TeacherScorer.load(path, student_tokenizer=tokenizer,
                                 device=cfg.teacher_device or device, dtype=cfg.teacher_dtype,
                                 batch_size=cfg.teacher_batch_size, temperature=temperature)
    return DistillationDeposits(teacher)
