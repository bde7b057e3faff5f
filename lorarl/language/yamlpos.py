"""Study YAML with positions: duplicate keys refused, and study errors pointed at their YAML line.

`load(text, source)` parses like `yaml.safe_load` but refuses a key written twice in one mapping
(PyYAML would silently keep the last one), and refuses aliases (`*name`) that would expand the file to
more than `MAX_ALIAS_NODES` nodes (an alias bomb: three lines can stand for billions of values) or that
refer to a node containing themselves: they are counted while the file is composed, node by node, before
any Python object is built. `annotate(message, text)` appends `(line N)` to each line
of a study error that names a field path (`defaults.train.lr`, `axes.rank.values[1]`, `exclude[0]`,
`name`, ...), using the line where that path (or its nearest written parent) sits in the file.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from lorarl.language.matrix import StudyError


MAX_ALIAS_NODES = 100_000  # nodes that all aliases of one file may stand for (a study needs a few hundred)


def _size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Nodes in `node` once every alias in it is expanded (memoised per node: linear in the written file)."""
    stack = [(node, False)]
    while stack:
        n, done = stack.pop()
        if id(n) in memo:
            continue
        kids = [] if isinstance(n, yaml.ScalarNode) else \
            [x for kv in n.value for x in kv] if isinstance(n, yaml.MappingNode) else list(n.value)
        if done:
            memo[id(n)] = 1 + sum(memo[id(k)] for k in kids)
        else:
            stack.append((n, True))
            stack.extend((k, False) for k in kids if id(k) not in memo)
    return memo[id(node)]


class _Loader(yaml.SafeLoader):
    """SafeLoader that counts what aliases expand to while composing (refused past MAX_ALIAS_NODES)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._open: set[str] = set()  # anchors whose node is being composed (an alias to one: recursive)
        self._memo: dict[int, int] = {}
        self._alias_nodes = 0  # nodes the aliases read so far stand for

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            line = event.start_mark.line + 1
            if event.anchor in self._open:
                raise StudyError(f"the alias *{event.anchor} at line {line} refers to a node that contains it (a "
                                 f"recursive structure); allowed: aliases to an anchor written before and outside them")
            node = super().compose_node(parent, index)
            size = _size(node, self._memo)
            self._alias_nodes += size
            if self._alias_nodes > MAX_ALIAS_NODES:
                raise StudyError(f"YAML aliases expand to more than {MAX_ALIAS_NODES:,} nodes (an alias bomb?): "
                                 f"the alias *{event.anchor} at line {line} alone stands for {size:,} nodes; allowed: "
                                 f"aliases (`*name`) that expand to at most {MAX_ALIAS_NODES:,} nodes in all per "
                                 f"file (write large values out, or nest fewer aliases)")
            return node
        anchor = self.peek_event().anchor if self.check_event(yaml.NodeEvent) else None
        if anchor is not None:
            self._open.add(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self._open.discard(anchor)


def _mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: its keys may be overridden
            continue
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else repr(key_node.value)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise StudyError(f"duplicate key {key!r} at line {line} (first at line {seen[key]}); "
                             f"a key must be written once per mapping (YAML would silently keep the last)")
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def load(text: str, source: str) -> Any:
    """yaml.safe_load + duplicate keys refused; errors name the file and the line."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except StudyError as err:
        raise StudyError(f"{source}: not a valid study YAML: {err}") from None
    except RecursionError:
        raise StudyError(f"{source}: not a valid study YAML: nested too deeply for the YAML parser; allowed: a "
                         f"study nested a few levels deep (name/defaults/axes)") from None
    except yaml.YAMLError as err:
        raise StudyError(f"{source}: not valid YAML (fix the syntax at the line shown; a study is a YAML "
                         f"mapping with name/defaults/axes): {err}") from None


def lines(text: str) -> dict[str, int]:
    """Dotted path (`a.b`, `a.list[2]`) -> 1-based line of that key or item."""
    out: dict[str, int] = {}
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return out

    def walk(node: Any, path: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                p = f"{path}.{k.value}" if path else str(k.value)
                out[p] = k.start_mark.line + 1
                walk(v, p)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                p = f"{path}[{i}]"
                out[p] = v.start_mark.line + 1
                walk(v, p)

    if root is not None:
        walk(root, "")
    return out


_PATH = re.compile(r"\b(?:defaults|axes|exclude|baseline|name|kind|seed_axis|search|hypotheses)(?:\.[A-Za-z0-9_\-]+|\[\d+\])*")


def _nearest(path: str, where: dict[str, int]) -> int | None:
    while path:
        if path in where:
            return where[path]
        cut = max(path.rfind("."), path.rfind("["))
        if cut <= 0:
            return None
        path = path[:cut]
    return None


def annotate(message: str, text: str) -> str:
    """Append `(line N)` to each message line naming a field path found in the YAML."""
    where = lines(text)
    if not where:
        return message
    out = []
    for line in message.splitlines():
        for m in _PATH.finditer(line.split(": ", 1)[-1] if line.startswith("invalid study") else line):
            n = _nearest(m.group(0), where)
            if n is not None:
                line = f"{line} (line {n})"
                break
        out.append(line)
    return "\n".join(out)
