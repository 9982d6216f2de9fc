"""The one YAML loader for everything ix-gpu reads: config files, fake-devices files, ``ix-gpu mutate``.

``yaml.safe_load`` is safe from code execution, not from hostile or careless input, and every gap
below was found the hard way:

* **Duplicate keys** are kept silently, last one wins: a config with a second ``policy:`` block
  (``privilegedNamespaces: ["*"]``) was accepted. YAML says mapping keys are unique; here a
  duplicate is an error naming the key, its line and the first one's line. "Duplicate" means "the
  same key of the resulting dict", so ``1``, ``1.0`` and ``true`` collide, and so do two ``<<``
  merge keys; a key that overrides one pulled in by a ``<<`` merge is not a duplicate (that is
  what merging is for).
* **Aliases** are shared, not copied: a billion-laughs bomb loads in microseconds and then costs
  gigabytes and minutes in whatever walks it (the mutation, ``jsonpatch``, the YAML dump). Aliases
  stay allowed (manifests share env lists and volumes through anchors), but the nodes they add,
  counted as if expanded, are bounded by ``max_alias_nodes`` (100,000 per stream): a bomb is refused
  in milliseconds, before anything is constructed. A recursive alias (``&a [*a]``) is refused.
  What comes back is a tree, as from JSON: each alias is an independent copy, so changing one place
  (``ix-gpu mutate`` applies patches) cannot change another.
* **Nesting** is bounded by ``max_depth`` (100 nodes deep, counted through aliases), so 10,000 levels
  are an error naming the line, not a ``RecursionError``. A Pod in a TFJob is about 15 deep; the
  deepest real CRD schemas (a Pod template under ``openAPIV3Schema``) about 40.
* **Size** is checked before parsing: 1 MiB for config files (real ones are a few KB, and a
  ConfigMap holds at most 1 MiB), 16 MiB for ``ix-gpu mutate``'s manifests (a dump of many objects;
  the API server takes about 3 MiB per object).
* **Errors** from every layer (``YAMLError``, the ``ValueError`` of a 5,001-digit integer or of the
  date ``2001-99-99``, the ``AttributeError`` of ``!!timestamp x``, undecodable bytes) become one
  :class:`YamlInputError` line that starts with the source and, where known, names the line.

How: libyaml parses and composes (``yaml.CSafeLoader``'s C code), then one Python walk over the
composed nodes checks keys, depth and aliases, visiting each node once however often it is aliased;
only then are Python objects constructed. On a 1 MB stream of 1,500 Pods and TFJobs that costs
1.2-1.3x ``CSafeLoader`` (0.3 s; the pure-Python ``SafeLoader`` takes 7-9x). libyaml composes
recursively in C, which is safe only because recent libyaml (0.2.6 here) refuses nesting beyond
1,000 levels itself; that is checked at import, and without it (or without libyaml) the same checks
run on PyYAML's Python parser, whose composer counts depth as it goes.
"""

from __future__ import annotations

from collections.abc import Callable
from re import Pattern
from typing import Any, Final, Protocol

import yaml
from yaml.composer import Composer
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.error import MarkedYAMLError
from yaml.nodes import MappingNode, Node, ScalarNode
from yaml.parser import Parser
from yaml.reader import Reader, ReaderError
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from ix_gpu.config.input_files import CONFIG_MAX_BYTES, MiB, YamlInputError, size_text
from ix_gpu.config.text import one_line
from ix_gpu.config.yaml_lines import node_line

MANIFEST_MAX_BYTES: Final = 16 * MiB
"""``ix-gpu mutate`` input: a dump of many objects, each at most ~3 MiB by the API server's limit."""

MAX_DEPTH: Final = 100
"""Nested nodes (the root is 1), aliases counted as expanded. Kubernetes objects need about 15, the
deepest CRD schemas about 40; Python's recursion limit (what walks the result recurses) is 1,000."""

MAX_ALIAS_NODES: Final = 100_000
"""Nodes that aliases may add to one stream, in all. Sharing a few env lists or volumes costs
hundreds; a billion-laughs bomb needs billions and is refused after about 100,000."""

_STR_TAG: Final = "tag:yaml.org,2002:str"
_MERGE_TAG: Final = "tag:yaml.org,2002:merge"
_VALUE_TAG: Final = "tag:yaml.org,2002:value"
_TIMESTAMP_TAG: Final = "tag:yaml.org,2002:timestamp"
_LIBYAML_NESTING_PROBLEM: Final = "exceeded maximum nesting depth"
_MERGE_KEY: Final = object()
"""Stands for ``<<`` in the duplicate check: it never becomes a dict key, so it has no value."""

_NO_TIMESTAMPS: Final = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP_TAG]
    for first, resolvers in Resolver.yaml_implicit_resolvers.items()
}
"""Implicit resolvers without dates: kubectl (go-yaml v2 into ``interface{}``) keeps
``2024-01-01`` a string, so ``ix-gpu mutate`` must too."""


class _LimitError(MarkedYAMLError):
    """A limit of this module, as opposed to bad YAML: reported as "refused", not "not valid"."""


def _short_tag(tag: str) -> str:
    return tag.removeprefix("tag:yaml.org,2002:")


class _StrictConstructor(SafeConstructor):
    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except (ValueError, TypeError, AttributeError, ArithmeticError) as exc:
            # PyYAML's scalar constructors on values that match a pattern but do not convert:
            # a 5,001-digit integer (Python's int-string limit), 2001-99-99, ``!!timestamp x``.
            reason = str(exc).split(";")[0]  # drop the int limit's advice to call a Python function
            raise ConstructorError(
                None,
                None,
                f"cannot read this {_short_tag(str(node.tag))}: {one_line(reason, 200)}",
                node.start_mark,
            ) from None


class _PyLoader(Reader, Scanner, Parser, Composer, _StrictConstructor, Resolver):
    """Pure Python, for a PyYAML without libyaml (or a libyaml that does not bound nesting itself).
    Python's composer recurses, so it counts depth itself: the walk after it would come too late."""

    def __init__(self, stream: bytes, max_depth: int) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self._depth = 0
        self._max_depth = max_depth

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        if self._depth > self._max_depth:
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            raise _LimitError(None, None, f"nested deeper than {self._max_depth} levels", mark)
        node = super().compose_node(parent, index)
        self._depth -= 1
        return node


class _Loader(Protocol):
    """What :func:`_load` uses of either loader class."""

    yaml_implicit_resolvers: dict[Any, list[tuple[str, Pattern[str]]]]

    def check_node(self) -> bool: ...
    def get_node(self) -> Node | None: ...
    def get_single_node(self) -> Node | None: ...
    def construct_document(self, node: Node) -> Any: ...
    def construct_object(self, node: Node, deep: bool = False) -> Any: ...
    def dispose(self) -> None: ...


_loader_class: Callable[[bytes, int], _Loader] = _PyLoader
"""The fastest loader that enforces the rules here; tests swap in the other."""

if yaml.__with_libyaml__:
    from yaml._yaml import CParser

    class _CLoader(CParser, _StrictConstructor, Resolver):
        """``yaml.CSafeLoader`` with the strict constructor: libyaml scans, parses and composes."""

        def __init__(self, stream: bytes, max_depth: int) -> None:
            CParser.__init__(self, stream)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

    def _libyaml_bounds_nesting() -> bool:
        """libyaml composes recursively in C, where deep input would overflow the stack; recent
        versions refuse nesting beyond 1,000 levels themselves. Asked, not looked up by version."""
        try:
            yaml.load("[" * 1001 + "]" * 1001, Loader=yaml.CSafeLoader)
        except yaml.YAMLError:
            return True
        return False

    if _libyaml_bounds_nesting():
        _loader_class = _CLoader


class _Checks:
    """The rules, checked on each composed document before anything is constructed.

    Walks the node graph once: every node is visited once however often it is aliased (a node
    reached again is an alias, measured from the memo), so a bomb costs what its text costs. Errors
    carry the node's line; for an alias that is the line of the anchored node (the composer keeps
    no position for the alias itself)."""

    def __init__(self, loader: _Loader, max_depth: int, max_alias_nodes: int) -> None:
        self._loader = loader
        self._max_depth = max_depth
        self._max_alias_nodes = max_alias_nodes
        self._alias_nodes = 0
        self._expanded: dict[int, tuple[int, int]] = {}
        self._open: set[int] = set()
        self.aliased = False
        """Whether the last document used an alias (so its data must be unshared)."""

    def document(self, root: Node) -> None:
        self._expanded = {}
        self._open = set()
        self.aliased = False
        self._visit(root, 1)

    def _visit(self, node: Node, depth: int) -> tuple[int, int]:
        """(nodes, height) of ``node`` at ``depth`` with its aliases expanded."""
        if depth > self._max_depth:
            raise _LimitError(None, None, f"nested deeper than {self._max_depth} levels", node.start_mark)
        if isinstance(node, ScalarNode):
            return 1, 1  # an aliased scalar adds one node: no more than its ``*name`` text does
        key = id(node)
        known = self._expanded.get(key)
        if known is not None:
            nodes, height = known
            self._alias_nodes += nodes
            self.aliased = True
            if self._alias_nodes > self._max_alias_nodes:
                raise _LimitError(
                    None,
                    None,
                    f"aliases expand to more than {self._max_alias_nodes:,} nodes (aliases of the node here)",
                    node.start_mark,
                )
            if depth - 1 + height > self._max_depth:
                raise _LimitError(
                    None,
                    None,
                    f"nested deeper than {self._max_depth} levels through an alias of the node here",
                    node.start_mark,
                )
            return known
        if key in self._open:
            raise _LimitError(None, None, "recursive alias: the node here contains itself", node.start_mark)
        self._open.add(key)
        if isinstance(node, MappingNode):
            self._unique_keys(node)
            children: list[Node] = [child for pair in node.value for child in pair]
        else:
            children = node.value
        nodes, height = 1, 0
        for child in children:
            if isinstance(child, ScalarNode) and depth < self._max_depth:
                nodes += 1
                height = max(height, 1)
                continue
            child_nodes, child_height = self._visit(child, depth + 1)
            nodes += child_nodes
            height = max(height, child_height)
        self._open.discard(key)
        self._expanded[key] = result = (nodes, height + 1)
        return result

    def _unique_keys(self, node: MappingNode) -> None:
        """Keys compared as the resulting dict would: ``1``, ``1.0`` and ``true`` collide. Checked
        on the node as written, before the constructor merges ``<<`` pairs in."""
        seen: dict[Any, Node] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode):
                continue  # a sequence or mapping key is unhashable: the constructor refuses it
            tag = key_node.tag
            if tag == _STR_TAG:
                key: Any = key_node.value  # what the constructor would make, without calling it
            elif tag == _MERGE_TAG:
                key = _MERGE_KEY
            elif tag == _VALUE_TAG:
                key = "="
            else:
                key = self._loader.construct_object(key_node, deep=True)
            first = seen.get(key)
            if first is not None:
                shown = "<<" if key is _MERGE_KEY else repr(key)
                raise ConstructorError(
                    None,
                    None,
                    f"duplicate key {one_line(shown, 80)} (first on line {node_line(first)})",
                    key_node.start_mark,
                )
            seen[key] = key_node


def _unshare(value: Any) -> Any:
    """A copy in which no list or dict appears twice (aliases made them shared). Bounded: the
    composer checked the expanded size and depth."""
    if isinstance(value, dict):
        return {key: _unshare(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_unshare(item) for item in value]
    if isinstance(value, tuple):  # !!omap and !!pairs
        return tuple(_unshare(item) for item in value)
    if isinstance(value, set):
        return set(value)
    return value


def _where(exc: MarkedYAMLError) -> str:
    mark = exc.problem_mark or exc.context_mark
    what = ": ".join(part for part in (exc.context, exc.problem) if part) or type(exc).__name__
    if mark is None:
        return what
    return f"line {mark.line + 1}, column {mark.column + 1}: {what}"


def _describe_reader_error(exc: ReaderError) -> str:
    character = exc.character
    code = f" (#x{character:02x})" if isinstance(character, int) and character >= 0 else ""
    return f"position {exc.position}: {exc.reason}{code}"


def _parse(content: bytes, multi: bool, max_depth: int, max_alias_nodes: int, timestamps: bool) -> list[Any]:
    loader = _loader_class(content, max_depth)  # the Python reader already decodes the start
    try:
        if not timestamps:
            loader.yaml_implicit_resolvers = _NO_TIMESTAMPS
        checks = _Checks(loader, max_depth, max_alias_nodes)

        def construct(node: Node | None) -> Any:
            if node is None:
                return None
            checks.document(node)
            data = loader.construct_document(node)
            return _unshare(data) if checks.aliased else data

        if not multi:
            return [construct(loader.get_single_node())]
        documents = []
        while loader.check_node():
            documents.append(construct(loader.get_node()))
        return documents
    finally:
        loader.dispose()


def _load(
    content: bytes | str,
    source: str,
    *,
    multi: bool,
    max_bytes: int,
    max_depth: int,
    max_alias_nodes: int,
    timestamps: bool,
    what: str,
) -> list[Any]:
    if len(content) > max_bytes:  # characters of a str: at least as many bytes
        raise YamlInputError(f"{source}: refused: larger than {size_text(max_bytes)}")
    if isinstance(content, str):
        try:
            content = content.encode("utf-8")
        except UnicodeError as exc:
            raise YamlInputError(f"{source}: not valid {what}: not text: {one_line(exc)}") from None
        if len(content) > max_bytes:
            raise YamlInputError(f"{source}: refused: larger than {size_text(max_bytes)}")
    try:
        return _parse(content, multi, max_depth, max_alias_nodes, timestamps)
    except _LimitError as exc:
        raise YamlInputError(f"{source}: refused: {one_line(_where(exc))}") from None
    except ReaderError as exc:
        raise YamlInputError(f"{source}: not valid {what}: {one_line(_describe_reader_error(exc))}") from None
    except MarkedYAMLError as exc:
        if exc.problem == _LIBYAML_NESTING_PROBLEM:  # libyaml's own cap (1,000) ran first: ours is lower
            exc.problem = f"nested deeper than {max_depth} levels"
            exc.context = None
            raise YamlInputError(f"{source}: refused: {one_line(_where(exc))}") from None
        raise YamlInputError(f"{source}: not valid {what}: {one_line(_where(exc))}") from None
    except yaml.YAMLError as exc:
        raise YamlInputError(f"{source}: not valid {what}: {one_line(exc)}") from None
    except RecursionError:  # not expected with the depth bound; kept so it can never be a traceback
        raise YamlInputError(f"{source}: refused: nested too deeply") from None
    except (ValueError, TypeError, AttributeError, ArithmeticError) as exc:
        raise YamlInputError(f"{source}: not valid {what}: {type(exc).__name__}: {one_line(exc)}") from None


def load_yaml(
    content: bytes | str,
    source: str,
    *,
    max_bytes: int = CONFIG_MAX_BYTES,
    max_depth: int = MAX_DEPTH,
    max_alias_nodes: int = MAX_ALIAS_NODES,
    timestamps: bool = True,
    what: str = "YAML",
) -> Any:
    """The one document in ``content`` (None when empty); every failure is a one-line
    :class:`YamlInputError` that starts with ``source``. ``what`` names the format in messages."""
    return _load(
        content,
        source,
        multi=False,
        max_bytes=max_bytes,
        max_depth=max_depth,
        max_alias_nodes=max_alias_nodes,
        timestamps=timestamps,
        what=what,
    )[0]


def load_yaml_documents(
    content: bytes | str,
    source: str,
    *,
    max_bytes: int = MANIFEST_MAX_BYTES,
    max_depth: int = MAX_DEPTH,
    max_alias_nodes: int = MAX_ALIAS_NODES,
    timestamps: bool = True,
    what: str = "YAML",
) -> list[Any]:
    """Every document of a ``---``-separated stream (None for an empty one), for manifests; the
    alias limit counts the whole stream. JSON is read as the YAML it is: the same limits apply."""
    return _load(
        content,
        source,
        multi=True,
        max_bytes=max_bytes,
        max_depth=max_depth,
        max_alias_nodes=max_alias_nodes,
        timestamps=timestamps,
        what=what,
    )


__all__ = [
    "MANIFEST_MAX_BYTES",
    "MAX_ALIAS_NODES",
    "MAX_DEPTH",
    "load_yaml",
    "load_yaml_documents",
]
