"""The house rules, checked statically: no import cycles in lorarl (between modules, and between its
rooms: top-level modules and subpackages, kept in layers), no module over 400 lines, and a README Layout
section that names every package.

The import graph counts every import of a lorarl module: at module level, inside functions (a
function-level import that only dodges a cycle is still a cycle) and under `if TYPE_CHECKING:`.
The last ones never execute, but they are the back edge that lets a function-level import close a
circle unseen (config -> evaluate.plan in a validator, plan -> config for its annotations): the
modules still depend on each other both ways. Lazy imports for light start-up are fine as long as
they do not close a cycle.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support.import_scan import imports_of_test_modules
from tests.support.name_scan import name_branches, name_tests
from tests.support.private_scan import private_touches

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 400  # the house limit for one module (source, tests, benchmarks, rules)
CHECKED_DIRS = ("lorarl", "workflow", "tests", "bench")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement anywhere in the module (functions and `if TYPE_CHECKING:` included)."""
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def import_graph(root: Path, package: str = "lorarl") -> dict[str, set[str]]:
    """module -> the lorarl modules it imports (a `from pkg import name` counts as pkg.name when that
    is a module, else as pkg)."""
    files = {module_name(p, root): p for p in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in _import_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in files)
                continue
            base = node.module or ""
            if node.level:  # relative import
                anchor = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                deps.add(sub if sub in files else base)
        graph[name] = {d for d in deps if d in files and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def _edges_within(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    return [f"{a} -> {b}" for a in comp for b in sorted(graph[a]) if b in comp]


def test_lorarl_has_no_import_cycle():
    graph = import_graph(REPO)
    assert len(graph) > 50 and "lorarl.train.main" in graph  # the scan found the package
    found = cycles(graph)
    assert not found, "import cycles (break them; never by a function-level import):\n" + "\n".join(
        "; ".join(_edges_within(graph, c)) for c in found)


def test_cycle_finder_finds_a_function_level_cycle(tmp_path: Path):
    """The checker itself: a cycle closed only inside a function is still reported, and so is one whose
    back edge is an annotation-only (`if TYPE_CHECKING:`) import."""
    pkg = tmp_path / "lorarl"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from lorarl.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from lorarl import a\n    return a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lorarl import a\n")
    (pkg / "d.py").write_text("from . import c\n")
    graph = import_graph(tmp_path)
    assert graph["lorarl.a"] == {"lorarl.sub.b"} and graph["lorarl.sub.b"] == {"lorarl.a"}
    assert graph["lorarl.c"] == {"lorarl.a"} and graph["lorarl.d"] == {"lorarl.c"}
    assert cycles(graph) == [["lorarl.a", "lorarl.sub.b"]]
    (pkg / "a.py").write_text("from lorarl.sub import b\ndef g():\n    from lorarl import d\n")  # a -> d -> c -> a
    assert cycles(import_graph(tmp_path)) == [["lorarl.a", "lorarl.c", "lorarl.d", "lorarl.sub.b"]]


SPLIT_PACKAGES = ("lorarl.language",)  # packages whose modules and subpackages are rooms of their own (on their own floors)


def room_of(module: str) -> str:
    """A module's room: lorarl's top-level module or subpackage it belongs to (lorarl.train.trainer ->
    lorarl.train, lorarl.paths -> lorarl.paths); inside a split package, its module or subpackage
    (lorarl.language.config -> lorarl.language.config, lorarl.language.evalplan.plan -> lorarl.language.evalplan)."""
    parts = module.split(".")
    return ".".join(parts[:3] if ".".join(parts[:2]) in SPLIT_PACKAGES else parts[:2])


def room_graph(graph: dict[str, set[str]]) -> dict[str, dict[str, str]]:
    """room -> {room it imports: one example import "module -> module"}; `lorarl/__init__.py` is no room
    (a `from lorarl import x` already counts as lorarl.x in import_graph)."""
    rooms: dict[str, dict[str, str]] = {}
    for mod in sorted(graph):
        if mod == "lorarl" or mod in SPLIT_PACKAGES:
            continue
        edges = rooms.setdefault(room_of(mod), {})
        for dep in sorted(graph[mod]):
            if dep != "lorarl" and room_of(dep) != room_of(mod):
                edges.setdefault(room_of(dep), f"{mod} -> {dep}")
    return rooms


def package_loops(rooms: dict[str, dict[str, str]]) -> list[str]:
    """Each loop between rooms: its rooms, then one example import per edge inside it."""
    return [" / ".join(c) + ":\n  " + "\n  ".join(rooms[a][b] for a in c for b in sorted(rooms[a]) if b in c)
            for c in cycles({r: set(e) for r, e in rooms.items()})]


def test_lorarl_has_no_package_level_loop():
    """No loop between lorarl's rooms, counting imports inside functions: a module-level-acyclic graph can
    still tie packages together (train.a -> evaluate.b at module level, evaluate.c -> train.d in a function)."""
    rooms = room_graph(import_graph(REPO))
    assert len(rooms) > 30 and "lorarl.train" in rooms["lorarl.pack"]  # the scan found the rooms and their edges
    loops = package_loops(rooms)
    assert not loops, ("package-level import loops (move the shared piece below both, or hand the value in; "
                       "never a function-level import or a re-export):\n" + "\n".join(loops))


def test_the_study_language_as_a_whole_is_in_no_loop():
    """Counted as one room, lorarl/language/ is in no loop either: the building blocks that read a section of it
    (tasks, decoding, rewards) are handed the section, or its base (lorarl.strict) sits below them."""
    whole: dict[str, set[str]] = {}
    for mod, deps in import_graph(REPO).items():
        whole.setdefault(".".join(mod.split(".")[:2]), set()).update(
            ".".join(d.split(".")[:2]) for d in deps if d != "lorarl" and d.split(".")[:2] != mod.split(".")[:2])
    loops = cycles({r: {d for d in e if d in whole} for r, e in whole.items() if r != "lorarl"})
    assert not loops, f"package-level loops with lorarl.language as one room: {loops}"


def test_package_loop_finder_sees_function_level_and_relative_imports(tmp_path: Path):
    """The checker itself: a loop closed by a function-level import between two modules that form no
    module-level cycle is reported with one example per edge; relative imports and `from lorarl import x`
    are resolved to their rooms."""
    pkg = tmp_path / "lorarl"
    for sub in ("a", "b"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("from ..b import y\n")
    (pkg / "a" / "w.py").write_text("")
    (pkg / "b" / "y.py").write_text("")
    (pkg / "b" / "z.py").write_text("def f():\n    from lorarl.a import w\n    return w\n")
    (pkg / "c.py").write_text("from . import d\n")
    (pkg / "d.py").write_text("")
    graph = import_graph(tmp_path)
    assert cycles(graph) == []  # no module-level cycle: the old test passes this tree
    rooms = room_graph(graph)
    assert rooms["lorarl.a"] == {"lorarl.b": "lorarl.a.x -> lorarl.b.y"}
    assert rooms["lorarl.c"] == {"lorarl.d": "lorarl.c -> lorarl.d"}
    assert package_loops(rooms) == ["lorarl.a / lorarl.b:\n  lorarl.a.x -> lorarl.b.y\n  lorarl.b.z -> lorarl.a.w"]
    (pkg / "d.py").write_text("def g():\n    from lorarl import c\n")  # `from lorarl import c` is room lorarl.c
    assert [loop.split(":")[0] for loop in package_loops(room_graph(import_graph(tmp_path)))] == [
        "lorarl.a / lorarl.b", "lorarl.c / lorarl.d"]


# lorarl's rooms, bottom to top: a room imports only rooms of its own layer or below (the loop test keeps
# a layer's rooms from tying themselves together); the stages import none of each other. A new module or
# subpackage of lorarl takes its place here. The study language (lorarl/language/) spans floors: its prompt and toy
# sections sit in the foundations, the study above the registries it checks against, so each of its modules is a
# room of its own (SPLIT_PACKAGES); no room below it imports it (the building blocks that read a section, tasks
# and decoding, are handed it), so lorarl.language as a whole is in no loop either.
LAYERS = (
    ("foundations", ("strict", "io", "paths", "jobclock", "ledger", "jobids", "gitrepo", "language.signature",
                     "language.reserved", "lazy_imports", "sampler_logprobs", "vllm_push", "wheelhouse", "stop_ids",
                     "provenance", "language.prompt", "language.toy", "build_progress", "faulthooks")),
    ("numerics and grading", ("numerics", "grading")),
    ("building blocks", ("adapters", "tasks", "models", "rewards", "tracking", "decoding")),
    ("config schema and registries", ("language.task", "language.config", "language.kinds", "language.evalplan")),
    ("study resolution", ("language.matrix", "language.yamlpos", "language.preflight", "language.hubcheck",
                          "language.hubreach", "language.adaptive", "adaptive", "language.study", "study_set", "language.profiles")),
    ("stages", ("train", "evaluate", "diagnose", "toy")),
    ("hosts and readers of stages", ("memory", "pack", "status", "report")),
    ("pipeline", ("pipeline",)),
    ("entry points", ("cli", "gpucheck", "badstudies", "badstudies_size")),
)
INDEPENDENT = ("stages",)  # layers whose rooms never import each other


def test_rooms_keep_their_layer():
    """Every room has its layer and imports none above it: low-level pieces never reach up into a stage,
    a stage never into the launcher or the CLI."""
    rooms = room_graph(import_graph(REPO))
    layer = {f"lorarl.{r}": (i, name) for i, (name, members) in enumerate(LAYERS) for r in members}
    assert sorted(rooms) == sorted(layer), "place every room of lorarl in LAYERS (and only those)"
    bad = [f"{a} ({layer[a][1]}) imports {b} ({layer[b][1]}): {why}" for a, edges in sorted(rooms.items())
           for b, why in sorted(edges.items())
           if layer[b][0] > layer[a][0] or (layer[b][0] == layer[a][0] and layer[a][1] in INDEPENDENT)]
    assert not bad, "a room reaches up a layer (or a stage imports a stage):\n" + "\n".join(bad)


def _checked_files() -> list[Path]:
    out = []
    for d in CHECKED_DIRS:
        out += [p for p in (REPO / d).rglob("*") if p.is_file() and p.suffix in {".py", ".smk"}
                and "__pycache__" not in p.parts]
    return sorted(out)


def test_no_module_over_400_lines():
    files = _checked_files()
    assert any(p.name == "Snakefile" or p.suffix == ".smk" for p in files)
    too_long = {str(p.relative_to(REPO)): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines (split them by responsibility): {too_long}"


def _layout_section() -> str:
    text = (REPO / "README.md").read_text()
    m = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert m, "README.md has no `## Layout` section"
    return m.group(1)


def test_readme_layout_names_every_package():
    layout = _layout_section()
    packages = sorted(str(p.parent.relative_to(REPO)) for p in (REPO / "lorarl").rglob("__init__.py")
                      if "__pycache__" not in p.parts)
    assert "lorarl/train" in packages and "lorarl/pipeline" in packages
    missing = [p for p in packages if f"{p}/" not in layout]
    assert not missing, f"README Layout does not name these packages: {missing}"


LOWER_THAN_TRAIN = ("lorarl.memory", "lorarl.pipeline")  # the floors above the trainer: planners, launchers


def walks_into(graph: dict[str, set[str]], start: str, targets: tuple[str, ...]) -> list[str]:
    """Each module under ``targets`` that the modules under ``start`` reach, with the import walk to it."""
    parent, stack = {}, [m for m in graph if m.startswith(start)]
    while stack:
        v = stack.pop()
        for w in graph[v]:
            if w not in parent and not w.startswith(start):
                parent[w] = v
                stack.append(w)
    walks = []
    for w in sorted(m for m in parent if m.startswith(targets)):
        path = [w]
        while not path[-1].startswith(start):
            path.append(parent[path[-1]])
        walks.append(" <- ".join(path))
    return walks


def test_train_reaches_nothing_above_it():
    """The trainer receives a resolved config (auto knobs, devices, ranks resolved where the job starts)
    and never reaches up: no lorarl.train module imports lorarl.memory or lorarl.pipeline, directly or
    through the modules it imports."""
    graph = import_graph(REPO)
    walks = walks_into(graph, "lorarl.train", LOWER_THAN_TRAIN)
    assert "lorarl.train.main" in graph and not walks, "lorarl.train reaches up (hand it a resolved config instead):\n" + "\n".join(walks)


def test_the_launcher_never_reaches_the_doctor():
    """The doctor registers its own stage (lorarl.pipeline.doctor.stage): no launcher module reaches the doctor."""
    graph = import_graph(REPO)
    walks = walks_into(graph, "lorarl.pipeline.jobs.", ("lorarl.pipeline.doctor",))
    assert {"lorarl.pipeline.jobs.launch", "lorarl.pipeline.doctor.stage"} <= set(graph) and not walks, walks


def test_no_regime_name_is_tested_outside_the_rewards_package():
    """A reward regime's facts (the models it loads, gold answers, accuracy, required settings) live in its
    registry entry (lorarl.rewards.RegimeSpec, Regime): no code elsewhere compares `reward.regime` with a name."""
    from lorarl.rewards.registry import regime_names

    names = set(regime_names())
    assert {"outcome", "distillation"} <= names  # the registry was read
    found = name_tests(REPO, names)
    assert not found, ("regime names tested outside lorarl/rewards/ (ask the regime's spec instead: "
                       "docs/contributing.md):\n" + "\n".join(found))


def test_the_regime_name_scan_sees_each_kind_of_test(tmp_path: Path):
    for d in ("lorarl/rewards", "workflow/rules", "scripts", "bench"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "Snakefile").write_text('x = config["regime"] != "outcome"\n')
    (tmp_path / "lorarl" / "rewards" / "own.py").write_text('ok = regime == "outcome"\n')  # the owner may
    (tmp_path / "lorarl" / "m.py").write_text('a = r.regime == "outcome"\nb = "x" != r\n'
                                              'c = r in ("y", "process")\nd = r.name in {"z"}\n')
    (tmp_path / "scripts" / "s.py").write_text('if "process" not in names:\n    pass\n')
    (tmp_path / "workflow" / "rules" / "r.smk").write_text('rule a:\n    run:\n        if cfg.regime == "process":\n'
                                                           '            x = r in ("process",)\n        y = "outcome"\n')
    assert name_tests(tmp_path, {"outcome", "process"}) == [
        "Snakefile:1", "lorarl/m.py:1", "lorarl/m.py:3", "scripts/s.py:1", "workflow/rules/r.smk:3",
        "workflow/rules/r.smk:4"]

# The stage registry (lorarl.pipeline.jobs.stages) carries every fact about a stage; nothing else tests a stage's name.
STAGE_REGISTRY = ("lorarl/pipeline/jobs/stages.py",)
STAGE_BRANCHES_ALLOWED: dict[str, str] = {}  # "file:line" -> why that branch must stay (none today)


def test_no_stage_name_is_tested_outside_the_stage_registry():
    """Adding a stage is one registry entry: its outputs, log key, OOM retry, resources key, ... are facts of
    the entry (lorarl.pipeline.jobs.stages.Stage), never a `stage == "..."` branch elsewhere."""
    from lorarl.pipeline.jobs.stages import STAGES

    assert {"train", "evaluate", "pack", "base"} <= set(STAGES)
    found = [b for b in name_branches(REPO, "stage", set(STAGES), STAGE_REGISTRY) if b not in STAGE_BRANCHES_ALLOWED]
    assert not found, ("branches on a stage's name outside lorarl/pipeline/jobs/stages.py (make it a field of the "
                       "stage's entry and ask get_stage):\n" + "\n".join(found))


def test_the_cost_model_and_the_eta_test_no_job_kind():
    """A planned job's cost and its ETA are facts of its kind's entry (lorarl.pipeline.jobs.stages.Timing; publish's
    and aggregate's: lorarl.pipeline.doctor.jobs.OWN_KINDS), never a `kind == "..."` branch in the cost model or the
    watch's ETA."""
    from lorarl.pipeline.doctor.jobs import job_kinds

    timed = ("lorarl/pipeline/doctor/costs.py", "lorarl/pipeline/progress/eta.py")
    found = [b for b in name_branches(REPO, "kind", job_kinds()) if b.split(":")[0] in timed]
    assert not found, "branches on a job kind (make it a field of its Timing):\n" + "\n".join(found)


def test_the_name_branch_finder_sees_each_form(tmp_path: Path):
    (tmp_path / "lorarl").mkdir()
    (tmp_path / "workflow").mkdir()
    (tmp_path / "Snakefile").write_text('x = 1 if stage == "toy" else 2\n')
    (tmp_path / "workflow" / "r.smk").write_text('rule a:\n    params:\n        k=1 if "pack" != wildcards.stage else 0\n')
    (tmp_path / "lorarl" / "m.py").write_text(
        'def f(stage, job, kind):\n    if stage == "train":\n        return 1\n'  # line 2
        '    if job.stage in ("base", "other"):\n        return 2\n'  # 4
        '    if "pack" != stage:\n        return 3\n'  # 6
        '    return kind == "train" or stage == "launcher" or stage in STAGES\n')  # no stage name beside `stage`
    assert name_branches(tmp_path, "stage", {"train", "base", "pack", "toy"}) == [
        "Snakefile:1", "lorarl/m.py:2", "lorarl/m.py:4", "lorarl/m.py:6", "workflow/r.smk:3"]
    assert name_branches(tmp_path, "stage", {"train"}, ("lorarl/m.py",)) == []


def test_no_module_touches_a_private_attribute_of_another_object(tmp_path: Path):
    """``x._name`` only on self/cls/super() or a name the module's classes use on self (tests/support/private_scan.py)."""
    (tmp_path / "m.py").write_text("def f(run, self):\n    return run._ckpt, self._ok, super()._ok, run.ok\n")
    assert private_touches(tmp_path) == ["m.py:2: run._ckpt"]  # the scan sees one
    found = private_touches(REPO / "lorarl")
    assert not found, "a private attribute of another object (give it a public name):\n" + "\n".join(found)


def test_no_test_module_imports_another():
    """What two test modules share lives in tests/support/ (tests/project/test_import_scan.py: the scan sees each form)."""
    assert imports_of_test_modules(REPO / "tests") == []
