"""``ix-gpu mutate``: the mutation core applied to local manifests.

The operator's preview tool ("what will the webhook do to this?"), and a way to run the exact
production code path without a cluster. It reads the namespace facts from flags, because there is
no cluster to ask; facts given that way are treated as known. The claims DRA pods reference come
from ``--claim-template`` files the same way; a claim not given is unknown, as a claim the
webhook's cache has not seen.

Every input error is one line on stderr and exit code 2: manifests go through the one strict loader
(:mod:`ix_gpu.config.yaml_input`: size, depth, alias and duplicate-key limits; JSON is read as
the YAML it is, under the same limits). An exception out of the mutation itself is a bug, not bad
input; the webhook answers it with a denial (fail closed), so the preview says "denied: internal
error" naming the exception type and exits 1 like any denial; ``-v`` adds the traceback.
"""

from __future__ import annotations

import json
import traceback
from dataclasses import dataclass, field
from typing import Any, TextIO

import jsonpatch
import yaml

from ix_gpu.config.input_files import ConfigError, YamlInputError
from ix_gpu.config.text import one_line
from ix_gpu.config.webhook_config import load_config
from ix_gpu.config.yaml_input import MANIFEST_MAX_BYTES, load_yaml_documents
from ix_gpu.webhook.core.claims import RESOURCE_CLAIM, RESOURCE_CLAIM_TEMPLATE, KnownClaims, claim_key
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from ix_gpu.webhook.core.decision import Decision, NamespaceFacts
from ix_gpu.webhook.core.mutation import mutate


@dataclass(frozen=True)
class MutateOptions:
    filename: str
    config_path: str | None = None
    namespace: str | None = None
    namespace_annotations: dict[str, str] = field(default_factory=dict)
    namespace_labels: dict[str, str] = field(default_factory=dict)
    patch_only: bool = False
    verbose: bool = False
    claim_files: tuple[str, ...] = ()
    """ResourceClaimTemplate / ResourceClaim manifests (``--claim-template``)."""


def _read_input(filename: str, stdin: TextIO) -> bytes:
    """At most :data:`MANIFEST_MAX_BYTES` + 1 bytes (so a huge file or /dev/zero costs nothing)."""
    limit = MANIFEST_MAX_BYTES + 1
    try:
        if filename != "-":
            with open(filename, "rb") as handle:
                return handle.read(limit)
        # Bytes where there are bytes to read: the loader decodes (and reports bad UTF-8) itself.
        buffer = getattr(stdin, "buffer", None)
        raw = buffer.read(limit) if buffer is not None else stdin.read(limit)
    except OSError as exc:
        raise YamlInputError(f"cannot read {filename}: {exc.strerror or exc}") from None
    except UnicodeError as exc:
        raise YamlInputError(f"cannot read stdin: {one_line(exc)}") from None
    return raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogateescape")


def _read_documents(filename: str, stdin: TextIO) -> list[Any]:
    """The non-empty documents of the input; every problem is a one-line :class:`YamlInputError`."""
    content = _read_input(filename, stdin)
    source = "stdin" if filename == "-" else filename
    documents = load_yaml_documents(
        content,
        source,
        max_bytes=MANIFEST_MAX_BYTES,
        timestamps=False,  # kubectl keeps 2024-01-01 a string; so does the object the webhook sees
        what="YAML or JSON",
    )
    return [doc for doc in documents if doc is not None]


def _describe(doc: Any) -> str:
    if not isinstance(doc, dict):
        return "document"
    meta = doc.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
    name = meta.get("name") or meta.get("generateName") or "?"
    return one_line(f"{doc.get('kind', '?')}/{name}", 120)


def _namespace(options: MutateOptions, doc: Any) -> str:
    if options.namespace:
        return options.namespace
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    namespace = meta.get("namespace") if isinstance(meta, dict) else None
    return namespace if isinstance(namespace, str) and namespace else "default"


def _read_claims(options: MutateOptions, stdin: TextIO) -> KnownClaims:
    """The claims of ``--claim-template`` files (the items of a List too). Other objects are passed
    over, so the file a user applies (a template and its pod) serves; a file with no claim at all,
    or a claim without a name, is a :class:`YamlInputError` naming the file."""
    objects: list[Any] = []
    for filename in options.claim_files:
        found = 0
        for doc in _read_documents(filename, stdin):
            for item in doc["items"] if _is_list(doc) else [doc]:
                kind = item.get("kind") if isinstance(item, dict) else None
                if kind not in (RESOURCE_CLAIM, RESOURCE_CLAIM_TEMPLATE):
                    continue
                if claim_key(item) is None:
                    raise YamlInputError(f"{filename}: a {kind} without metadata.name")
                found += 1
                metadata = item["metadata"]
                if options.namespace and not metadata.get("namespace"):
                    item = {**item, "metadata": {**metadata, "namespace": options.namespace}}
                objects.append(item)
        if not found:
            raise YamlInputError(f"{filename} holds no ResourceClaimTemplate or ResourceClaim")
    return KnownClaims.of(objects)


def _mutate_one(
    doc: Any, options: MutateOptions, config: CompiledConfig, claims: KnownClaims, stderr: TextIO
) -> list[Any] | None:
    """The patch ops for one document, or None when it is denied (said on stderr)."""
    facts = NamespaceFacts(
        name=_namespace(options, doc),
        labels=options.namespace_labels,
        annotations=options.namespace_annotations,
    )
    result = mutate(doc, "CREATE", facts, config, claims)
    for warning in result.warnings:
        print(f"Warning: {_describe(doc)}: {warning}", file=stderr)
    if result.decision is Decision.DENIED:
        print(f"ix-gpu mutate: {_describe(doc)} denied: {result.reason}", file=stderr)
        return None
    if options.verbose:
        print(f"{_describe(doc)}: {result.decision.value}: {result.reason}", file=stderr)
    return result.ops


def run_mutate(options: MutateOptions, stdin: TextIO, stdout: TextIO, stderr: TextIO) -> int:
    """Exit code 0 all mutated or passed through, 1 something denied (an internal error included:
    the webhook denies on one too), 2 unreadable input or config; every error one line on stderr."""
    try:
        config = CompiledConfig(load_config(options.config_path))
    except ConfigError as exc:
        print(f"ix-gpu mutate: invalid config: {exc}", file=stderr)
        return 2
    try:
        documents = _read_documents(options.filename, stdin)
        claims = _read_claims(options, stdin)
    except ConfigError as exc:
        print(f"ix-gpu mutate: {exc}", file=stderr)
        return 2

    denied = False
    outputs: list[str] = []
    for doc in documents:
        if not _is_list(doc):
            result = _result_of(doc, options, config, claims, stderr)
            denied |= result is None
            outputs += [] if result is None else [_render(doc, result, options)]
            continue
        # A List (what `kubectl get -o yaml` prints) is never admitted itself; each item is an
        # object the webhook would see. Its patches are one per item; the List keeps the items
        # that would be admitted, mutated.
        kept = []
        for item in doc["items"]:
            result = _result_of(item, options, config, claims, stderr)
            denied |= result is None
            if result is not None and options.patch_only:
                outputs.append(_render(item, result, options))
            elif result is not None:
                kept.append(jsonpatch.apply_patch(item, result) if result else item)
        if not options.patch_only:
            outputs.append(yaml.safe_dump({**doc, "items": kept}, sort_keys=False))
    if options.patch_only:
        stdout.write("".join(line + "\n" for line in outputs))
    else:
        stdout.write("---\n".join(outputs))
    return 1 if denied else 0


def _is_list(doc: Any) -> bool:
    """``kind: List`` (or a typed list, ``PodList``) with its ``items``."""
    kind = doc.get("kind") if isinstance(doc, dict) else None
    return isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list)


def _result_of(
    doc: Any, options: MutateOptions, config: CompiledConfig, claims: KnownClaims, stderr: TextIO
) -> list[Any] | None:
    """The patch ops for one object, or None when it is denied (said on stderr)."""
    try:
        return _mutate_one(doc, options, config, claims, stderr)
    except Exception as exc:  # a bug in the mutation, reported like the webhook's fail-closed denial
        hint = "" if options.verbose else " (-v for the traceback)"
        print(
            f"ix-gpu mutate: {_describe(doc)} denied: internal error in the ix-gpu webhook: "
            f"{type(exc).__name__}: {one_line(exc, 200)}{hint}",
            file=stderr,
        )
        if options.verbose:
            traceback.print_exc(file=stderr)
        return None


def _render(doc: Any, ops: list[Any], options: MutateOptions) -> str:
    if options.patch_only:
        return json.dumps(ops)
    mutated = jsonpatch.apply_patch(doc, ops) if ops else doc
    return yaml.safe_dump(mutated, sort_keys=False)
