"""Hand-written YAML and JSON config text: a key given twice is refused, a parse error is one
line.

PyYAML and the json module keep the last of two equal keys without a word, so a web config
with `basic_auth_users:` twice, or a policy with `quotas:` twice, silently drops the first. For
hand-written config files that is a mistake to report, not a choice to guess. (Snapshots report
a repeated key by its JSON path instead: `advisor.snapshot.parse_json`.)
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from gpu_defrag_common.messages import one_line

# Values of one config with every alias (*name) expanded: ten lines of anchors nesting ten
# aliases each are 10^9 values, which parse in 12 ms and then took 489 s to walk once.
MAX_EXPANDED_VALUES = 100_000


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader whose mappings refuse a repeated key (the merge key `<<` excepted), and that
    refuses a document whose aliases expand past `MAX_EXPANDED_VALUES` values."""

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            size = _expanded_size(node, {})
            if size > MAX_EXPANDED_VALUES:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"aliases expand to {size:,} values, at most {MAX_EXPANDED_VALUES:,}",
                    node.start_mark,
                )
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line)
            except TypeError:  # an unhashable key: the base class says so
                break
            if first != key_node.start_mark.line:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} given twice (first on line {first + 1})",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """Values under `node` as if each alias were a copy (each distinct node counted once in
    time: `sizes` remembers them; a node that contains itself counts once)."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    sizes[id(node)] = 1
    if isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_size(child, sizes) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size = 1 + sum(
            _expanded_size(key, sizes) + _expanded_size(value, sizes) for key, value in node.value
        )
    else:
        size = 1
    sizes[id(node)] = size
    return size


def load_yaml(text: str) -> Any:
    """`yaml.safe_load`, but a key given twice in a mapping raises yaml.YAMLError (naming the
    key and both lines)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


def load_json(text: str) -> Any:
    """`json.loads`, but a key given twice in an object raises ValueError naming it."""
    return json.loads(text, object_pairs_hook=_unique_object)


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} given twice in one object")
        out[key] = value
    return out


def parse_problem(error: Exception) -> str:
    """One line for a parse error. PyYAML's message spans lines with the source excerpt and a
    caret; say where (line, column, 1-based) and what instead."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None)
    if mark is None or not problem:
        return one_line(error)
    context = getattr(error, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(f"{where}: {problem}{f' ({context})' if context else ''}".split())
