"""Private attributes of another object (tests/project/test_structure.py): a module touches ``x._name`` only when ``x`` is
``self``, ``cls`` or ``super()``, or ``_name`` is one its own classes use on ``self`` (Python's privacy is the
module's). Anything else gets a public name, or an entry below with its reason."""

from __future__ import annotations

import ast
from pathlib import Path

# (module path under the scanned root, attribute): the libraries' internals lorarl reaches into on purpose, each the
# only way to the behaviour it needs at the pinned versions (docs/contributing.md, /work/shared/notes)
ALLOWED = {
    ("decoding.py", "_compile_all_devices"): "transformers' CompileConfig has no public switch to compile on a CPU",
    ("memory/measure.py", "_generate_and_score_completions"): "TRL's one batch of rollouts, measured on its own",
    ("pack/lora_memory.py", "_adapter_manager"): "vLLM's worker LoRA manager's cache: the one way to add a LoRA "
                                                 "built from tensors (no file) at 0.31",
    ("pack/routing.py", "_cast_input_dtype"): "PEFT's LoRA layer casts its input this way; the packed forward must match",
    ("tracking/credentials.py", "_tracking_store_registry"): "MLflow registers tracking stores by scheme only here",
    ("tracking/sqlite_store.py", "_engine_map"): "MLflow caches one SQLAlchemy engine per URI with no public reset",
    ("train/rowsample.py", "_prepare_generation_config"): "transformers' own merge of a generation config (HF sampling)",
    ("train/sharding.py", "_shared_state"): "accelerate's PartialState: FSDP on a CPU, as AcceleratorState's init does",
    ("train/vllm_sync.py", "_llm_weights_sleeping"): "TRL's VLLMGeneration flag, kept true to TRL's own sync_weights",
}


def _own(tree: ast.AST) -> set[str]:
    """The private names the module's own classes use on ``self``/``cls`` or declare in a class body (fields, methods)."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"):
            out.add(n.attr)
        if isinstance(n, ast.ClassDef):
            out.update(b.name for b in n.body if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)))
            out.update(b.target.id for b in n.body if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name))
    return out


def private_touches(root: Path, allowed: dict | None = None) -> list[str]:
    """``path:line: expr`` of every ``x._name`` (not a dunder) of another object under ``root``, less ``allowed``."""
    allowed = ALLOWED if allowed is None else allowed
    hits = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(), str(path))
        own = _own(tree)
        for n in ast.walk(tree):
            if not (isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__")):
                continue
            v = n.value
            if isinstance(v, ast.Name) and v.id in ("self", "cls") or n.attr in own or (rel, n.attr) in allowed:
                continue
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super":
                continue
            hits.append(f"{rel}:{n.lineno}: {ast.unparse(n)}")
    return sorted(set(hits))
