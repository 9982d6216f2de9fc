"""``ix-gpu mutate``: the mutation core applied to local manifests.

The operator's preview tool ("what will the webhook do to this?"), and a way to run the exact
production code path without a cluster. It reads the namespace facts from flags, because there is
no cluster to ask; facts given that way are treated as known.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TextIO

import jsonpatch
import yaml

from devicemodel.webhook_config import ConfigError, load_config
from webhook.compiled_config import CompiledConfig
from webhook.decision import Decision, NamespaceFacts
from webhook.mutation import mutate


@dataclass(frozen=True)
class MutateOptions:
    filename: str
    config_path: str | None = None
    namespace: str | None = None
    namespace_annotations: dict[str, str] = field(default_factory=dict)
    namespace_labels: dict[str, str] = field(default_factory=dict)
    patch_only: bool = False
    verbose: bool = False


def _read_documents(filename: str, stdin: TextIO) -> list[Any]:
    try:
        if filename == "-":
            text = stdin.read()
        else:
            with open(filename, encoding="utf-8") as handle:
                text = handle.read()
    except OSError as exc:
        raise ValueError(f"cannot read {filename}: {exc.strerror or exc}") from None
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        raise ValueError(f"{filename}: not valid YAML or JSON: {' '.join(str(exc).split())}") from None


def _describe(doc: Any) -> str:
    if not isinstance(doc, dict):
        return "document"
    meta = doc.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
    name = meta.get("name") or meta.get("generateName") or "?"
    return f"{doc.get('kind', '?')}/{name}"


def run_mutate(options: MutateOptions, stdin: TextIO, stdout: TextIO, stderr: TextIO) -> int:
    try:
        config = CompiledConfig(load_config(options.config_path))
    except ConfigError as exc:
        print(f"ix-gpu mutate: invalid config: {exc}", file=stderr)
        return 2
    try:
        documents = _read_documents(options.filename, stdin)
    except ValueError as exc:
        print(f"ix-gpu mutate: {exc}", file=stderr)
        return 2

    exit_code = 0
    outputs: list[str] = []
    for doc in documents:
        meta = doc.get("metadata") if isinstance(doc, dict) else None
        namespace = options.namespace or (meta or {}).get("namespace") or "default"
        facts = NamespaceFacts(
            name=str(namespace),
            labels=options.namespace_labels,
            annotations=options.namespace_annotations,
        )
        result = mutate(doc, "CREATE", facts, config)
        for warning in result.warnings:
            print(f"Warning: {_describe(doc)}: {warning}", file=stderr)
        if result.decision is Decision.DENIED:
            print(f"ix-gpu mutate: {_describe(doc)} denied: {result.reason}", file=stderr)
            exit_code = 1
            continue
        if options.verbose:
            print(f"{_describe(doc)}: {result.decision.value}: {result.reason}", file=stderr)
        if options.patch_only:
            outputs.append(json.dumps(result.ops))
        else:
            mutated = jsonpatch.apply_patch(doc, result.ops) if result.ops else doc
            outputs.append(yaml.safe_dump(mutated, sort_keys=False))
    if options.patch_only:
        stdout.write("".join(line + "\n" for line in outputs))
    else:
        stdout.write("---\n".join(outputs))
    return exit_code
