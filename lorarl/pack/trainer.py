"""The packed trainer's update: K cells, one batched forward, per-cell loss, optimiser and clipping.

    cells = [PackCell("c0", peft_model_0, optimizer_0, LossSettings(...), scheduler_0, max_grad_norm=1.0), ...]
    pack = PackedTrainer(cells, temperature=[1.0, 0.7, ...])  # one per cell (or one for all)
    out = pack.step([batch_0, batch_1, ...])     # one TRL-shaped batch per cell (prompt/completion ids+masks,
                                                 # advantages, old/ref log-probs)

What is per cell: the loss and its normalisation (:mod:`lorarl.pack.loss`), the gradient (cell k's
adapter only ever sees cell k's rows, so the gradient of the summed loss w.r.t. cell k's parameters is
the gradient of cell k's loss), gradient clipping, optimiser, scheduler, divergence (a cell whose loss
or gradient norm is not finite is stopped: its optimiser does not step and it leaves the pack; the
others go on). What is shared: the frozen base weights and the one forward/backward.

Padding: the cells' batches are padded to common widths (prompts on the left, completions on the
right). Extra left padding shifts positions; ``position_ids`` put every real token at the position it
has in the cell's own batch, so a packed row computes what the solo trainer computes.

Not here: rollout generation with per-cell sampling RNG and the regime scoring (:mod:`lorarl.pack.steps`);
the update takes batches already scored (what ``LorarlGRPOTrainer._generate_and_score_completions``
returns). One optimiser update per generation batch.

Memory: ``update_cells`` cells and ``micro_batch_size`` rows of each per forward/backward, or each cell's
chunk of at most ``micro_batch_tokens`` positions (:mod:`lorarl.train.tokenbudget`; the cells' chunks of one
forward are then padded to common widths, so a forward holds at most cells x the widest chunk). Chunks are
scaled by their share of the cell's normaliser (:func:`lorarl.train.microbatch.chunk_share`), so every
cell's gradient is its unbatched update's. With activation checkpointing the backward recomputes the
routed forward: it runs inside the same routing as the forward (``Router.route``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from lorarl.pack.loss import EXTREMES, LossSettings, cell_loss
from lorarl.pack.routing import Router
from lorarl.pack.tiled import LOGIT_TOKENS, cell_logps, entropy_of, tiled_logps
from lorarl.train.microbatch import chunk_share, split_rows
from lorarl.train.tokenbudget import put_back, split_tokens


@dataclass
class PackCell:
    """One cell of a pack: its own PEFT model (adapter), optimiser, scheduler and loss settings."""

    name: str  # why: the cell's id (its results directory)
    model: Any  # why: the cell's PEFT model; its base weights must equal cell 0's
    optimizer: torch.optim.Optimizer  # why: per-cell optimiser state (Adam moments never mix)
    loss: LossSettings = field(default_factory=LossSettings)  # why: per-cell β, loss type, clip range
    scheduler: Any = None  # why: per-cell learning-rate schedule
    max_grad_norm: float | None = 1.0  # why: per-cell clipping (a pack-wide norm would couple cells)
    state: str = "running"  # why: "running", or "diverged" once its loss/gradient is not finite
    diverged_at: int | None = None  # why: the step whose update was refused

    def params(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]


def _pad_left(x: torch.Tensor, width: int, value: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (width - x.size(1), 0), value=value)


def _pad_right(x: torch.Tensor, width: int, value: float) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, width - x.size(1)), value=value)


def _mask(batch: dict) -> torch.Tensor:
    mask_BT = batch["completion_mask"]
    return mask_BT * batch["tool_mask"] if "tool_mask" in batch else mask_BT


def _row_chunks(batch: dict, m: int | None, tokens: int | None = None) -> list[tuple[list[int], dict]]:
    """A cell's update batch as (rows, chunk): chunks of ``m`` rows, or of at most ``tokens`` positions
    (lorarl.train.tokenbudget: rows sorted by length, each chunk trimmed), one chunk when neither is set; each
    chunk carries the whole batch's token count (dapo's normaliser, ``num_items_in_batch``)."""
    B = batch["completion_ids"].size(0)
    if not tokens and (not m or m >= B):
        return [(list(range(B)), batch)]
    if "num_items_in_batch" not in batch:
        batch = {**batch, "num_items_in_batch": _mask(batch).sum()}
    if tokens:
        return split_tokens(batch, tokens)
    return [(list(range(lo, min(lo + m, B))), c) for lo, c in zip(range(0, B, m), split_rows(batch, m))]


def _accumulate(out: dict, k: int, loss: torch.Tensor, stats: dict, tokens: float) -> None:
    """Cell k's update loss (sum of its chunks' shares) and token-weighted stats (means over its tokens)."""
    prev_loss, prev_stats, prev_tokens = out.get(k, (0.0, {}, 0.0))
    merged = {n: (EXTREMES[n](prev_stats[n], v) if n in prev_stats else v) if n in EXTREMES
              else prev_stats.get(n, 0.0) + v * tokens for n, v in stats.items()}
    out[k] = (prev_loss + loss, merged, prev_tokens + tokens)


class PackedTrainer:
    """Trains K cells that share one frozen base in one batched forward per step."""

    def __init__(self, cells: list[PackCell], *, pad_token_id: int = 0, fused_lm_head: bool = True,
                 temperature: float | list[float] = 1.0, update_cells: int | None = None,
                 micro_batch_size: int | None = None, micro_batch_tokens: int | None = None, trl_head: bool = False,
                 batch_invariant: bool = False):
        for c in cells:
            c.loss.check()
        self.cells = cells
        self.router = Router([c.model for c in cells])
        self.host = cells[0].model
        self.pad_token_id = int(pad_token_id)
        self.fused_lm_head = fused_lm_head  # TRL's log-prob head (trl.trainer.utils.add_fused_lm_head on the host)
        # TRL's fused head's kernel called per cell (lorarl.pack.tiled.cell_logps): the solo job's log-prob
        # arithmetic with each cell's own temperature; plain-head models only (else the tiled path)
        self.trl_head = trl_head
        # cells per forward/backward of the update (None: all in one). Rows never interact, so any chunking
        # gives the same result bit for bit; smaller chunks hold fewer activations (memory), one pass is
        # one batched forward (speed on a GPU)
        self.update_cells = update_cells
        self.micro_batch_size = micro_batch_size  # rows of each cell per forward/backward (None: all)
        self.micro_batch_tokens = micro_batch_tokens  # or token positions of each cell's chunk (wins when set)
        # runtime.batch_invariant: every forward/backward holds one cell's rows (its pack-of-one shapes), so no
        # kernel sees a pack-mate's rows (lorarl.numerics.invariant); one pass per cell, slower on a GPU
        self.batch_invariant = batch_invariant
        self._sizes: list[int] | None = None  # the routing of the last forward (its backward recomputes it)
        self.logit_tokens = LOGIT_TOKENS  # tokens of fp32 vocabulary logits per tile (lorarl.pack.tiled)
        # TRL divides the logits by the cell's temperature (unfused path; the fused head takes one for all)
        temps = list(temperature) if isinstance(temperature, (list, tuple)) else [temperature] * len(cells)
        if len(temps) != len(cells):
            raise ValueError(f"temperature: {len(temps)} values for {len(cells)} cells")
        self.temperatures = [float(t) for t in temps]
        if fused_lm_head and len(set(self.temperatures)) > 1:
            raise ValueError("the fused log-prob head takes one temperature: cells with different temperatures "
                             "need fused_lm_head=False")
        self.global_step = 0
        self.last_logps: dict[int, torch.Tensor] = {}  # cell -> detached log-probs of its last update's forward
        self.last_entropy: dict[int, torch.Tensor] = {}  # cell -> per-token entropy of the last forward that asked

    def running(self) -> list[int]:
        return [k for k, c in enumerate(self.cells) if c.state == "running"]

    # ------------------------------------------------------------------ forward
    def logps(self, batches: list[dict], idx: list[int], entropy: bool = False) -> list[torch.Tensor]:
        """Per-token log-probs ``[B_k, T_k]`` of each listed cell's completion tokens, one forward. ``entropy``:
        also each token's next-token entropy (detached), kept in ``last_entropy`` (cell -> ``[B_k, T_k]``)."""
        ent: list[torch.Tensor] | None = [] if entropy else None
        P = max(batches[k]["prompt_ids"].size(1) for k in idx)
        T = max(batches[k]["completion_ids"].size(1) for k in idx)
        ids, attn, pos = [], [], []
        for k in idx:
            b = batches[k]
            p_k, t_k = b["prompt_ids"].size(1), b["completion_ids"].size(1)
            ids.append(torch.cat([_pad_left(b["prompt_ids"], P, self.pad_token_id),
                                  _pad_right(b["completion_ids"], T, self.pad_token_id)], dim=1))
            attn.append(torch.cat([_pad_left(b["prompt_mask"], P, 0), _pad_right(b["completion_mask"], T, 0)], dim=1))
            pos_L = torch.arange(P + T, device=b["prompt_ids"].device) - (P - p_k)  # real tokens: own positions
            pos.append(pos_L.unsqueeze(0).expand(b["prompt_ids"].size(0), -1))
        input_ids, attention_mask, position_ids = torch.cat(ids), torch.cat(attn), torch.cat(pos)
        sizes = [0] * len(self.cells)
        for k in idx:
            sizes[k] = batches[k]["prompt_ids"].size(0)
        self._sizes = sizes
        with self.router.route(sizes):
            if self.fused_lm_head:
                labels = input_ids.masked_fill(attention_mask == 0, -100)
                labels[:, :-T] = -100
                out = self.host(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                labels=labels, fused_lm_head=True)
                logp_all = out.log_probs[:, -T:]
                if ent is not None and getattr(out, "entropy", None) is not None:  # a head built with "entropy"
                    ent.append(out.entropy[:, -T:].detach())
            else:
                logp_all = None
                if self.trl_head:  # the solo job's head, each cell's rows at its own temperature
                    rows, at = [], 0
                    for k in idx:
                        rows.append((slice(at, at + sizes[k]), self.temperatures[k]))
                        at += sizes[k]
                    logp_all = cell_logps(self.host, input_ids, attention_mask, position_ids, T, rows, ent)
            if logp_all is None:
                temp = None
                if any(self.temperatures[k] != 1.0 for k in idx):  # each cell's rows by its own temperature
                    temp = torch.cat([torch.full((sizes[k],), self.temperatures[k], device=input_ids.device)
                                      for k in idx])[:, None, None]
                logp_all = tiled_logps(self.host, input_ids, attention_mask, position_ids, T, temp,
                                       self.logit_tokens, ent)  # vocabulary logits a tile of tokens at a time
                if logp_all is None:
                    logits = self.host(input_ids=input_ids, attention_mask=attention_mask,
                                       position_ids=position_ids).logits[:, -T - 1:-1].float()
                    logits = logits if temp is None else logits / temp
                    logp_all = torch.log_softmax(logits, -1)
                    if ent is not None:
                        ent.append(entropy_of(logp_all.detach()))
                    logp_all = logp_all.gather(-1, input_ids[:, -T:].unsqueeze(-1)).squeeze(-1)
        ent_all = torch.cat(ent, dim=1) if ent else None
        res, start = [], 0
        self.last_entropy = {}
        for k in idx:
            n, t_k = sizes[k], batches[k]["completion_ids"].size(1)
            res.append(logp_all[start:start + n, :t_k])
            if ent_all is not None:
                self.last_entropy[k] = ent_all[start:start + n, :t_k]
            start += n
        return res

    def logps_chunked(self, batches: list[dict], idx: list[int]) -> list[torch.Tensor]:
        """:meth:`logps` (no grad) at most ``micro_batch_size`` rows (or ``micro_batch_tokens`` positions) of
        each cell per forward."""
        if self.batch_invariant and len(idx) > 1:  # one cell per forward: its own batch shapes
            return [self.logps_chunked(batches, [k])[0] for k in idx]
        m, tokens = self.micro_batch_size, self.micro_batch_tokens
        if not m and not tokens:
            return self.logps(batches, idx)
        pieces = {k: _row_chunks(batches[k], m, tokens) for k in idx}
        parts: dict[int, list] = {k: [] for k in idx}
        for j in range(max(len(v) for v in pieces.values())):
            sub = [k for k in idx if j < len(pieces[k])]
            chunk = [pieces[k][j][1] if k in sub else None for k in range(len(batches))]
            for k, lp in zip(sub, self.logps(chunk, sub)):
                parts[k].append((pieces[k][j][0], lp))
        return [put_back(parts[k], *batches[k]["completion_ids"].shape) for k in idx]

    def losses(self, batches: list[dict]) -> dict[int, tuple[torch.Tensor, dict]]:
        """Cell index → (loss with grad, stats), for the running cells that have a batch (None: no step)."""
        idx = [k for k in self.running() if batches[k] is not None]
        if not idx:
            return {}
        lps = self.logps(batches, idx, entropy=True)
        self.last_logps = {k: lp.detach() for k, lp in zip(idx, lps)}
        return {k: cell_loss(self.cells[k].loss, lp, batches[k], self.last_entropy.get(k)) for k, lp in zip(idx, lps)}

    # ------------------------------------------------------------------ update
    def step(self, batches: list[dict]) -> dict[str, dict[str, float]]:
        """One optimiser step of every running cell on its own batch (``None``: that cell skips this step);
        returns per-cell metrics."""
        if len(batches) != len(self.cells):
            raise ValueError(f"step got {len(batches)} batches for {len(self.cells)} cells")
        self.global_step += 1
        for c in self.cells:
            c.model.train()
            c.optimizer.zero_grad(set_to_none=True)
        idx = [k for k in self.running() if batches[k] is not None]
        chunk = 1 if self.batch_invariant else max(1, self.update_cells or len(idx) or 1)
        out: dict[int, tuple[torch.Tensor, dict]] = {}
        kept: dict[int, list[torch.Tensor]] = {}
        rows = {k: _row_chunks(batches[k], self.micro_batch_size, self.micro_batch_tokens) for k in idx}
        for i in range(0, len(idx), chunk):
            part = idx[i:i + chunk]
            for j in range(max(len(rows[k]) for k in part)):
                sub = {k: rows[k][j][1] for k in part if j < len(rows[k])}
                o = self.losses([sub.get(k) for k in range(len(batches))])
                for k, lp in self.last_logps.items():
                    kept.setdefault(k, []).append((rows[k][j][0], lp))
                if not o:
                    continue
                share = {k: chunk_share(self.cells[k].loss.loss_type, _mask(sub[k]), _mask(batches[k]))
                         for k in o}
                with self.router.route(self._sizes):  # a checkpointed backward recomputes the routed forward
                    sum(loss * share[k] for k, (loss, _) in o.items()).backward()  # frees this chunk's activations
                for k, (loss, stats) in o.items():
                    _accumulate(out, k, loss.detach() * share[k], stats, float(_mask(sub[k]).sum()))
        self.last_logps = {k: put_back(v, *batches[k]["completion_ids"].shape) for k, v in kept.items()}
        if not out:
            return {}
        out = {k: (loss, {n: v if n in EXTREMES else v / max(tokens, 1.0) for n, v in stats.items()})
               for k, (loss, stats, tokens) in out.items()}
        metrics: dict[str, dict[str, float]] = {}
        for k, (loss, stats) in out.items():
            c = self.cells[k]
            params = c.params()
            if c.max_grad_norm:
                norm = float(torch.nn.utils.clip_grad_norm_(params, c.max_grad_norm))
            else:
                norm = float(torch.linalg.vector_norm(torch.stack(
                    [torch.linalg.vector_norm(p.grad) for p in params if p.grad is not None])))
            lv = float(loss.detach())
            if not (math.isfinite(lv) and math.isfinite(norm)):
                c.state, c.diverged_at = "diverged", self.global_step  # stopped; the others go on
                c.optimizer.zero_grad(set_to_none=True)
                metrics[c.name] = {"loss": lv, "grad_norm": norm, "diverged": 1.0}
                continue
            c.optimizer.step()
            if c.scheduler is not None:
                c.scheduler.step()
            metrics[c.name] = {"loss": lv, "grad_norm": norm, **stats}
        return metrics
