"""The Dockerfile, checked without a container engine (there is none on these machines).

What a build would do is reproduced from the same inputs: the build context is filtered by
.dockerignore, the COPY'd files are built into a wheel exactly as ``pip install .`` builds them,
and the console script named by ENTRYPOINT is run from that install.
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from tests.support.paths import ROOT

DOCKERFILE = ROOT / "Dockerfile"
CONSTRAINTS = "constraints.txt"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, rest = line.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    assert not pending, "Dockerfile ends inside a continuation"
    return out


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for keyword, rest in _instructions():
        if keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((keyword, rest))
    return stages


def _pyproject() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as handle:
        return tomllib.load(handle)


def _ignored(relative: str) -> bool:
    """.dockerignore semantics for our patterns: last match wins, ``!`` re-includes, a directory
    pattern covers what is under it."""
    patterns = [
        p.strip()
        for p in (ROOT / ".dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    ignored = False
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern.lstrip("!").rstrip("/")
        if body.startswith("**/"):
            hit = any(fnmatch.fnmatchcase(part, body[3:]) for part in parts)
        else:
            hit = any(fnmatch.fnmatchcase(prefix, body) for prefix in prefixes)
        if hit:
            ignored = not negate
    return ignored


def _copy_sources() -> list[str]:
    sources: list[str] = []
    for stage in _stages():
        for keyword, rest in stage:
            if keyword != "COPY":
                continue
            args = shlex.split(rest)
            if any(a.startswith("--from") for a in args):
                continue
            sources.extend(a for a in args[:-1] if not a.startswith("--"))
    return sources


def test_every_copy_source_exists_and_is_in_the_build_context() -> None:
    sources = _copy_sources()
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such path"
        assert not _ignored(source), f"COPY {source}: excluded by .dockerignore"


def test_dockerignore_matcher_is_not_vacuous() -> None:
    assert _ignored("tests/chart/test_dockerfile.py")
    assert _ignored(".venv/bin/python")
    assert _ignored("ix_gpu/webhook/__pycache__/app.cpython-311.pyc")
    assert not _ignored("ix_gpu/webhook/service/app.py")


def test_the_image_gets_every_package_and_file_the_build_needs() -> None:
    project = _pyproject()
    copied = set(_copy_sources())
    for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]:
        top = pattern.split(".")[0]
        assert top in copied, f"package {top} is not copied into the image"
    assert project["project"]["readme"] in copied  # setuptools reads it for the metadata
    assert "pyproject.toml" in copied and CONSTRAINTS in copied
    assert "setup.py" in copied  # the native build (IX_GPU_COMPILE=1)


def test_multi_stage_slim_non_root_entrypoint() -> None:
    stages = _stages()
    assert len(stages) >= 2
    final = stages[-1]
    assert "slim" in next(rest for keyword, rest in _instructions() if keyword == "ARG")
    assert any(k == "COPY" and "--from=build" in rest for k, rest in final)
    (user,) = [rest for keyword, rest in final if keyword == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "numeric non-root USER, so runAsNonRoot can be checked"
    chart_deployment = (ROOT / "charts/ix-gpu/templates/webhook-deployment.yaml").read_text()
    assert f"runAsUser: {uid}" in chart_deployment
    (entrypoint,) = [rest for keyword, rest in final if keyword == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["ix-gpu"], "exec form, so signals reach the process"
    assert _pyproject()["project"]["scripts"]["ix-gpu"] == "ix_gpu.cli:main"


def _pip_install_args(command: str) -> list[str]:
    words = shlex.split(command)
    start = next(i for i, w in enumerate(words) if w == "install" and words[i - 1] == "pip")
    return words[start + 1 :]


def _dockerfile_installs() -> list[list[str]]:
    """Each ``pip install`` of the Dockerfile's RUN lines (one RUN may chain several with ``&&``)."""
    runs = [rest for keyword, rest in _instructions() if keyword == "RUN" and "pip install" in rest]
    commands = [c for run in runs for c in run.split("&&") if "pip install" in c]
    return [_pip_install_args(c) for c in commands]


def test_the_image_installs_from_the_constraints_file() -> None:
    """Everything the image installs is pinned; the package goes in twice, pure with its
    dependencies, then compiled (setup.py's IX_GPU_COMPILE) without isolation, so that mypyc
    type-checks against the pinned dependencies; its build tools stay outside the venv."""
    pure, tools, native = _dockerfile_installs()
    assert pure == ["--no-compile", "-c", CONSTRAINTS, "."]
    assert tools[:2] == ["--no-compile", "--target"] and not tools[2].startswith("/opt/ix-gpu")
    assert ("-c", CONSTRAINTS) in itertools.pairwise(tools) and "mypy" in tools and "setuptools" in tools
    assert native[-3:] == ["-c", CONSTRAINTS, "."] and "--no-build-isolation" in native
    (run,) = [rest for keyword, rest in _instructions() if keyword == "RUN" and "IX_GPU_COMPILE=1" in rest]
    assert f"PYTHONPATH={tools[2]}" in run
    final = _stages()[-1]
    assert not any(tools[2] in rest for keyword, rest in final if keyword == "COPY"), "build tools shipped"


def test_the_image_compiles_its_bytecode_independent_of_file_times() -> None:
    """pip's pyc files record each source's mtime; an export that rounds mtimes leaves them stale
    and every start recompiles (the real-node tier's image test counts stale pyc files)."""
    runs = [rest for keyword, rest in _instructions() if keyword == "RUN" and "compileall" in rest]
    assert len(runs) == 1, runs
    assert "--invalidation-mode unchecked-hash" in runs[0] and "/opt/ix-gpu" in runs[0], runs
    order = [rest for keyword, rest in _instructions() if keyword == "RUN"]
    assert order.index(runs[0]) > max(i for i, rest in enumerate(order) if "pip " in rest), order


def test_ci_installs_with_the_same_constraints_file() -> None:
    """The image must carry the versions the suite passed with: CI's install uses the same file."""
    script = (ROOT / "scripts" / "test.sh").read_text()
    installs = [line for line in script.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    assert installs, "scripts/test.sh installs nothing?"
    for line in installs:
        args = _pip_install_args(line.replace(".venv/bin/python -m ", "python -m "))
        pairs = list(itertools.pairwise(args))
        assert ("-c", CONSTRAINTS) in pairs, (
            f"scripts/test.sh: {line.strip()!r} does not use -c {CONSTRAINTS}"
        )


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / CONSTRAINTS).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{CONSTRAINTS}: {line!r} is not an exact pin"
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_constraints_pin_every_dependency_inside_its_declared_range() -> None:
    pins = _pins()
    project = _pyproject()["project"]
    requirements = [Requirement(r) for r in project["dependencies"]]
    requirements += [Requirement(r) for r in project["optional-dependencies"]["dev"]]
    for requirement in requirements:
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        assert name in pins, f"{requirement.name} is not pinned in {CONSTRAINTS}"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{CONSTRAINTS} pins {name}=={pins[name]}, outside {requirement}"
        )


@pytest.mark.timeout(300)
def test_build_context_installs_and_the_entrypoint_resolves(tmp_path: Path) -> None:
    """``pip install .`` from exactly the COPY'd files, then ENTRYPOINT's command from that install.

    Dependencies come from this venv (no network); the package itself comes only from the wheel
    built out of the filtered build context, which is what a Docker build would install.
    """
    context = tmp_path / "context"
    for source in _copy_sources():
        src = ROOT / source
        if src.is_dir():
            shutil.copytree(
                src,
                context / source,
                ignore=lambda d, names: [n for n in names if _ignored(str((Path(d) / n).relative_to(ROOT)))],
            )
        else:
            (context / source).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, context / source)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(wheels),
            str(context),
        ],
        check=True,
        cwd=tmp_path,
        timeout=240,
    )
    (wheel,) = wheels.glob("ix_gpu-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    # One installed package: generic names such as "plugin" or "webhook" must never reach site-packages.
    assert tops == {"ix_gpu", "ix_gpu-0.1.0.dist-info"}, sorted(tops)
    prefix = tmp_path / "prefix"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            # Without it pip uninstalls the project's own (editable) install from this venv first.
            "--ignore-installed",
            "--prefix",
            str(prefix),
            str(wheel),
        ],
        check=True,
        cwd=tmp_path,
        timeout=120,
    )
    (site,) = prefix.glob("lib/python*/site-packages")
    entrypoint = json.loads(next(r for k, r in _stages()[-1] if k == "ENTRYPOINT"))[0]
    script = prefix / "bin" / entrypoint
    assert script.is_file(), f"the wheel installs no {entrypoint} console script"
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}
    for argv in ([], ["webhook"], ["plugin"], ["config"]):
        done = subprocess.run(
            [str(script), *argv, "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
    where = subprocess.run(
        [str(script), "config", "default"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert where.returncode == 0 and "WebhookConfig" in where.stdout, where.stderr
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import ix_gpu.plugin, ix_gpu.webhook; print(ix_gpu.__file__, ix_gpu.plugin.__file__)",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert all(path.startswith(str(site)) for path in probe.stdout.split()), probe.stdout
    installed = {p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file()}
    for data in ("ix_gpu/plugin/api/deviceplugin_v1beta1.proto", "ix_gpu/py.typed"):
        assert any(f.endswith(data) for f in installed), f"{data} missing from the installed package"
