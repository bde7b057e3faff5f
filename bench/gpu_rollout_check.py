"""GPU check of the rollout path (on a GPU box, from the repo root: PYTHONPATH=. python bench/gpu_rollout_check.py).

LorarlGRPOTrainer on CUDA in bf16: the HF engine, then TRL's real colocated-vLLM code path with tests/support/fake_vllm.py
as the engine (vLLM itself is not installed): live LoRA, sleep mode, full fine-tuning, and a stale engine that must
trip the freshness gate. Prints rollout/logp_diff_mean per step (the bf16 sampler/trainer gap) for each run.
"""
import sys, time, tempfile, torch, datasets
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests/support/fake_vllm.py
from tests.support import fake_vllm
from pytest import MonkeyPatch
from trl import GRPOConfig
from lorarl.language.config import RolloutConfig
from lorarl.train.trainer import LorarlGRPOTrainer
from lorarl.rewards.outcome import OutcomeDeposits
from lorarl.train.rollout import RolloutStaleError
from lorarl.train.trl_args import rollout_fields
from lorarl.models import TinyRecipe, build_tiny, build_tokenizer

d = tempfile.mkdtemp()
tok = build_tokenizer(["Q: 12+34=?\nA: 12+34=46\n\\boxed{46}", "0123456789+-=?\nQA: \\boxed{}"] * 20, vocab_size=300)
torch.manual_seed(0)
m = build_tiny(TinyRecipe(hidden=256, layers=4, heads=4, kv_heads=2, intermediate=768), len(tok), tok.eos_token_id, tok.pad_token_id)
m.generation_config.eos_token_id = tok.eos_token_id
m.to(torch.bfloat16).save_pretrained(d); tok.save_pretrained(d)
ds = datasets.Dataset.from_list([{"prompt": f"Q: {10+i}+{20+i}=?\nA: ", "answer": str(30+2*i)} for i in range(64)])
score = lambda c, a=None: [float(sum(map(ord, x)) % 5) / 4 for x in c]

def run(tag, rollout, stale=False, steps=6, lr=1e-2, peft=True, engine_vllm=True):
    mp = MonkeyPatch(); fake_vllm.install(mp, stale=stale)
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
    if peft:
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    a = GRPOConfig(output_dir=tempfile.mkdtemp(), learning_rate=lr, max_steps=steps, per_device_train_batch_size=16,
                   num_generations=4, max_completion_length=24, temperature=1.0, beta=0.0, seed=0, logging_steps=1,
                   save_strategy="no", report_to="none", bf16=True, disable_tqdm=True, dataloader_num_workers=0,
                   **(rollout_fields(rollout) if engine_vllm else {}))
    tr = LorarlGRPOTrainer(model=model, regime=OutcomeDeposits(score_fn=score), args=a, ref_model=None, rollout=rollout,
                           train_dataset=ds, processing_class=tok)
    t0 = time.time(); err = None
    try:
        tr.train()
    except RolloutStaleError as e:
        err = str(e)[:120]
    rows = tr.state.log_history
    diffs = [round(r["rollout/logp_diff_mean"], 5) for r in rows if "rollout/logp_diff_mean" in r]
    gen = [round(r["time/generate_s"], 3) for r in rows if "time/generate_s" in r]
    print(f"[{tag}] device {tr.accelerator.device} dtype {next(tr.model.parameters()).dtype} steps {tr.state.global_step} "
          f"wall {time.time()-t0:.1f}s logp_diff_mean {diffs} generate_s {gen} stale_error {err!r}", flush=True)
    mp.undo()

run("hf engine", RolloutConfig(), engine_vllm=False, steps=3)
run("vllm live bf16", RolloutConfig(engine="vllm"))
run("vllm live bf16 sleep", RolloutConfig(engine="vllm", sleep_mode=True), steps=3)
run("vllm live full-ft", RolloutConfig(engine="vllm"), peft=False, steps=4, lr=1e-4)
run("vllm STALE", RolloutConfig(engine="vllm", freshness_threshold=0.05, freshness_patience=2), stale=True, peft=False, steps=20, lr=1e-3)
print("peak GPU GiB", torch.cuda.max_memory_allocated() / 2**30)
