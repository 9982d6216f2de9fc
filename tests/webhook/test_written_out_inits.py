"""The dataclasses made on every review write their ``__init__`` out, because the one
``dataclasses`` generates runs interpreted even in the compiled build. Written out, it must stay
the generated one's twin: every field a parameter, in order, with the field's default, and every
field set. A field added to the class but not to its ``__init__`` fails here, on both builds."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from ix_gpu.config.webhook_config import default_config
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from ix_gpu.webhook.core.decision import Decision, MutationResult
from ix_gpu.webhook.core.gpu_requests import GpuContainer
from ix_gpu.webhook.core.injection_record import TemplateRecord
from ix_gpu.webhook.core.injection_run import InjectionRun
from ix_gpu.webhook.core.pod_injection import _TemplateMerge
from ix_gpu.webhook.core.templates import PodTemplate
from ix_gpu.webhook.service.admission_review import ReviewRequest

PROFILES = CompiledConfig(default_config()).profiles

# Each class with a value for every field, none of them its default.
EVERY_FIELD: list[tuple[type, dict[str, Any]]] = [
    (
        ReviewRequest,
        {
            "uid": "u",
            "operation": "CREATE",
            "kind": "Pod",
            "namespace": "ns",
            "name": "p",
            "obj": {"kind": "Pod"},
            "dry_run": True,
        },
    ),
    (
        MutationResult,
        {
            "decision": Decision.MUTATED,
            "ops": [{"op": "add", "path": "/x", "value": 1}],
            "warnings": ["w"],
            "reason": "r",
            "profiles": ("gpu",),
            "pod_security_unchecked": True,
            "allowed_unknown": "claim",
        },
    ),
    (
        GpuContainer,
        {
            "list_name": "containers",
            "index": 2,
            "name": "c",
            "body": {"name": "c"},
            "profiles": PROFILES,
            "claims_only": True,
        },
    ),
    (PodTemplate, {"pointer": "/spec/template", "where": "spec.template", "body": {"spec": {}}}),
    (
        _TemplateMerge,
        {
            "spec": {"containers": []},
            "spec_ptr": "/spec",
            "where": "",
            "profiles": PROFILES,
            "run": InjectionRun("digest", None, None),
            "record": TemplateRecord(),
        },
    ),
]


@pytest.mark.parametrize(("cls", "values"), EVERY_FIELD, ids=lambda v: getattr(v, "__name__", ""))
def test_every_field_is_a_parameter_in_order_and_is_set(cls: type, values: dict[str, Any]) -> None:
    names = [f.name for f in dataclasses.fields(cls)]
    assert list(values) == names
    by_keyword = cls(**values)
    by_position = cls(*values.values())
    for name, value in values.items():
        assert getattr(by_keyword, name) is value, name
        assert getattr(by_position, name) is value, name
    assert by_keyword == by_position


@pytest.mark.parametrize(("cls", "values"), EVERY_FIELD, ids=lambda v: getattr(v, "__name__", ""))
def test_a_field_left_out_gets_its_default(cls: type, values: dict[str, Any]) -> None:
    required = {
        f.name: values[f.name]
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    made = cls(**required)
    for f in dataclasses.fields(cls):
        if f.name in required:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        assert getattr(made, f.name) == default, f.name
    if cls is MutationResult:  # a factory's default is a new list each time, as generated
        assert made.ops is not cls(**required).ops
