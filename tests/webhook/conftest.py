from __future__ import annotations

import pytest

from ix_gpu.config.webhook_config import default_config, load_config
from ix_gpu.webhook.core.compiled_config import CompiledConfig
from tests.support.paths import EXAMPLES


@pytest.fixture(scope="session")
def default_compiled() -> CompiledConfig:
    return CompiledConfig(default_config())


@pytest.fixture(scope="session")
def seed_compiled() -> CompiledConfig:
    return CompiledConfig(load_config(EXAMPLES / "seed-config.yaml"))
