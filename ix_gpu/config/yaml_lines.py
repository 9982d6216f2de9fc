"""Where in a YAML document a field is: the line an error message points an operator to.

Apart from :mod:`.yaml_input`, which bounds and parses untrusted YAML, because this runs only on
text that has already passed it, and only when a config is invalid.
"""

from __future__ import annotations

from collections.abc import Sequence

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode


def node_line(node: Node) -> int:
    """The 1-based line a node starts on."""
    return int(node.start_mark.line) + 1


def lines_of(content: bytes | str, paths: Sequence[Sequence[int | str]]) -> list[int | None]:
    """For each path of keys and indices into ``content``'s one document, the line (1-based) of the
    deepest node the path reaches: a mapping entry's key, a list item's start. A part that is not
    in the text (a missing field, a union member's tag, a key pulled in by a ``<<`` merge) stops the
    walk there; ``None`` when not even its first part is.

    For error messages only: ``content`` must already have passed :func:`.yaml_input.load_yaml` (size, depth,
    aliases, duplicate keys), which makes composing it a second time safe; a valid config never
    pays for it."""
    root = yaml.compose(content, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return [_line_along(root, path) for path in paths]


def _line_along(node: Node | None, path: Sequence[int | str]) -> int | None:
    line = None
    for part in path:
        if isinstance(node, MappingNode) and isinstance(part, str):
            found = next(
                (pair for pair in node.value if isinstance(pair[0], ScalarNode) and pair[0].value == part),
                None,
            )
            if found is None:
                break
            line, node = node_line(found[0]), found[1]
        elif isinstance(node, SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node_line(node)
        else:
            break
    return line
