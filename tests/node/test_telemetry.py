"""Per-chip telemetry (ix_gpu.node.telemetry): bounded reads in the unit, and the real
``ix-gpu plugin`` serving the fake backend's figures on /metrics, read back with Prometheus'
own text parser (prometheus_client's), a hung chip going stale alone while the endpoint answers."""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ix_gpu.node.backends.base import Chip
from ix_gpu.node.telemetry import FIGURES, Telemetry
from tests.plugin.plugin_testkit import FAST_HEALTH
from tests.support.net import free_port
from tests.support.paths import ROOT
from tests.support.plugin_process import PluginProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


def chip(n: int) -> Chip:
    return Chip(f"GPU-{n}", n, n, f"b{n // 2}", n % 2, "Iluvatar BI-V150", 32768, 0)


class Source:
    """A backend's telemetry side: counts calls; a chip in ``hang`` blocks until released, one in
    ``fail`` raises."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.hang: set[str] = set()
        self.fail: set[str] = set()
        self.release = threading.Event()
        self.lock = threading.Lock()

    def read_telemetry(self, chip: Chip) -> dict[str, float]:
        with self.lock:
            self.calls[chip.uuid] = self.calls.get(chip.uuid, 0) + 1
        if chip.uuid in self.hang:
            self.release.wait(30)
        if chip.uuid in self.fail:
            raise RuntimeError("library says no")
        return {"temperature_celsius": 40.0 + chip.index}  # utilization: not readable


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def settle(telemetry: Telemetry, reads: int) -> None:
    wait_until(lambda: telemetry.reads >= reads, f"{reads} chip reads", 5, interval=0.01)


def test_one_read_per_chip_per_interval_however_often_it_is_scraped() -> None:
    source, clock = Source(), Clock()
    telemetry = Telemetry(source, interval=10, clock=clock)
    chips = [chip(0), chip(1)]
    first = telemetry.collect(chips)
    assert [t.stale for t in first] == [True, True]  # nothing read yet: said, not shown as 0
    settle(telemetry, 2)
    for _ in range(50):
        clock.now += 0.1
        shown = telemetry.collect(chips)
    assert source.calls == {"GPU-0": 1, "GPU-1": 1}
    assert [(t.stale, t.reading) for t in shown] == [
        (False, {"temperature_celsius": 40.0}),
        (False, {"temperature_celsius": 41.0}),
    ]
    clock.now += 10
    telemetry.collect(chips)
    settle(telemetry, 4)
    assert source.calls == {"GPU-0": 2, "GPU-1": 2}


def test_a_hung_chip_goes_stale_alone_and_is_not_read_again_until_its_call_returns() -> None:
    source, clock = Source(), Clock()
    source.hang.add("GPU-1")
    telemetry = Telemetry(source, interval=10, clock=clock)
    chips = [chip(0), chip(1), chip(2)]
    telemetry.collect(chips)
    settle(telemetry, 2)  # GPU-0 and GPU-2; GPU-1 hangs
    for _ in range(3):
        clock.now += 10
        before = telemetry.reads
        started = time.monotonic()
        shown = {t.chip.uuid: t for t in telemetry.collect(chips)}
        assert time.monotonic() - started < 0.05  # a scrape never waits on the library
        settle(telemetry, before + 2)
    assert shown["GPU-1"].stale and shown["GPU-1"].reading == {}
    assert not shown["GPU-0"].stale and not shown["GPU-2"].stale
    assert source.calls["GPU-1"] == 1  # one call in flight, none piled up behind it
    before = telemetry.reads
    source.release.set()
    settle(telemetry, before + 1)
    clock.now += 10
    telemetry.collect(chips)
    wait_until(lambda: source.calls["GPU-1"] == 2, "GPU-1 read again once its call returned", 5)


def test_a_failing_read_leaves_the_chip_stale_and_the_others_fresh() -> None:
    source, clock = Source(), Clock()
    source.fail.add("GPU-0")
    telemetry = Telemetry(source, interval=10, clock=clock)
    chips = [chip(0), chip(1)]
    telemetry.collect(chips)
    settle(telemetry, 2)
    shown = telemetry.collect(chips)
    assert [(t.chip.uuid, t.stale) for t in shown] == [("GPU-0", True), ("GPU-1", False)]


TELEMETRY = (
    "        telemetry: {utilization: 37, memoryUtilization: 12, memoryUsedMiB: 2048, temperature: 91,"
    " powerWatts: 155.5, smClockMHz: 1500, memoryClockMHz: 1200, eccCorrectedErrors: 3,"
    " eccUncorrectedErrors: 0}\n"
)
LABELS = ("node", "uuid", "index", "board", "product")


TYPES: dict[str, str] = {}
"""Each family's type as the last :func:`scrape` parsed it, by the name its samples carry."""


def scrape(port: int) -> tuple[float, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    started = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    took = time.monotonic() - started
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
            TYPES[sample.name] = family.type
    return took, samples


def chip_series(samples: dict[Any, float], name: str, uuid: str) -> dict[str, float]:
    """``name``'s samples for ``uuid``: by ``problem`` label where it has one, else under ``""``."""
    found = {}
    for (metric, labels), value in samples.items():
        label_map = dict(labels)
        if metric == name and label_map.get("uuid") == uuid:
            assert set(LABELS) <= set(label_map), label_map
            found[label_map.get("problem", "")] = value
    return found


def test_the_plugin_serves_each_chips_figures_and_a_hung_chip_goes_stale_alone(
    short_tmp: Path, fake_devices: Path
) -> None:
    """Chip 0 has every figure and health 0x4; chip 1 none but its memory total (what the file
    leaves out is absent, never 0); chip 2's reads hang for a minute. /metrics answers within 1 s
    throughout, chip 2 stale alone."""
    text = fake_devices.read_text()
    chips = text.split("      - uuid: ")
    chips[1] = chips[1].replace("health: 0\n", "health: 4\n" + TELEMETRY, 1)
    chips[3] = chips[3].replace("health: 0\n", "health: 0\n        telemetry: {hangSeconds: 60}\n", 1)
    port = free_port()
    (short_tmp / "dp").mkdir()  # no kubelet there: /metrics serves all the same
    plugin = PluginProcess(
        short_tmp,
        short_tmp / "dp",
        "      - uuid: ".join(chips),
        FAST_HEALTH,
        short_tmp,
        metrics_port=port,
        node="gpu-node-1",
        extra_args=("--telemetry-interval", "0.5"),
    ).start()
    uuid = "GPU-7d0d7c1e-6f0a-5a4c-9b51-0a1b2c3d4e0"

    def settled() -> bool:
        try:
            samples = scrape(port)[1]
        except OSError:  # not serving yet
            return False
        stale = [chip_series(samples, "ix_gpu_chip_telemetry_stale", f"{uuid}{n}") for n in (0, 2)]
        return stale == [{"": 0.0}, {"": 1.0}]

    try:
        wait_until(
            settled,
            "chip 2 stale, chip 0 fresh",
            20,
            interval=0.2,
            details=plugin.log_tail,
        )
        took, samples = scrape(port)
    finally:
        plugin.stop()
    assert took < 1, took
    figures = {f.metric: chip_series(samples, f.metric, f"{uuid}0") for f in FIGURES}
    assert figures == {
        "ix_gpu_chip_utilization_percent": {"": 37.0},
        "ix_gpu_chip_memory_utilization_percent": {"": 12.0},
        "ix_gpu_chip_memory_used_bytes": {"": 2048 * 2**20},
        "ix_gpu_chip_memory_total_bytes": {"": 32768 * 2**20},
        "ix_gpu_chip_temperature_celsius": {"": 91.0},
        "ix_gpu_chip_power_watts": {"": 155.5},
        "ix_gpu_chip_sm_clock_hertz": {"": 1.5e9},
        "ix_gpu_chip_memory_clock_hertz": {"": 1.2e9},
        "ix_gpu_chip_ecc_corrected_errors_total": {"": 3.0},
        "ix_gpu_chip_ecc_uncorrected_errors_total": {"": 0.0},  # a count of 0 is a reading
    }
    # The library's counts are counters (increase() reads them across a reset), the rest gauges.
    assert {f.metric: TYPES[f.metric] for f in FIGURES} == {
        f.metric: "counter" if f.metric.endswith("_errors_total") else "gauge" for f in FIGURES
    }
    problems = chip_series(samples, "ix_gpu_chip_health_problem", f"{uuid}0")
    assert problems["over temperature"] == 1.0 and sum(problems.values()) == 1.0, problems
    labels = dict(next(lbl for (name, lbl) in samples if name == "ix_gpu_chip_temperature_celsius"))
    assert labels == {
        "node": "gpu-node-1",
        "uuid": f"{uuid}0",
        "index": "0",
        "board": "board0",
        "product": "Iluvatar BI-V150",
    }
    # Chip 1: only what the file gives (its memory total and health bits), nothing shown as 0.
    assert chip_series(samples, "ix_gpu_chip_memory_total_bytes", f"{uuid}1") == {"": 32768 * 2**20}
    assert chip_series(samples, "ix_gpu_chip_utilization_percent", f"{uuid}1") == {}
    assert chip_series(samples, "ix_gpu_chip_temperature_celsius", f"{uuid}1") == {}
    # Chip 2 hangs: stale, and none of its figures shown.
    assert all(chip_series(samples, f.metric, f"{uuid}2") == {} for f in FIGURES)
    assert chip_series(samples, "ix_gpu_chip_telemetry_stale", f"{uuid}3") == {"": 0.0}


def test_scrapes_three_intervals_apart_find_every_chip_fresh(short_tmp: Path, fake_devices: Path) -> None:
    """A Prometheus scraping every 30 s with the chart's 10 s telemetry interval: the plugin reads
    on its own clock, so each scrape, however far apart, shows every chip's figures and none stale
    (read only when scraped, each scrape found the last reading older than two intervals)."""
    text = fake_devices.read_text()
    port = free_port()
    (short_tmp / "dp").mkdir()
    plugin = PluginProcess(
        short_tmp,
        short_tmp / "dp",
        text.replace("health: 0\n", "health: 0\n" + TELEMETRY),
        FAST_HEALTH,
        short_tmp,
        metrics_port=port,
        node="gpu-node-1",
        extra_args=("--telemetry-interval", "0.3"),
    ).start()
    uuid = "GPU-7d0d7c1e-6f0a-5a4c-9b51-0a1b2c3d4e0"
    chips = [f"{uuid}{n}" for n in range(text.count("- uuid: "))]
    try:
        wait_until(lambda: _serving(port), "/metrics answering", 20, details=plugin.log_tail)
        seen = []
        for _ in range(4):
            time.sleep(1.0)  # more than three intervals since the last scrape
            samples = scrape(port)[1]
            seen.append(
                [
                    (
                        chip_series(samples, "ix_gpu_chip_telemetry_stale", chip),
                        chip_series(samples, "ix_gpu_chip_temperature_celsius", chip),
                    )
                    for chip in chips
                ]
            )
    finally:
        plugin.stop()
    assert len(chips) >= 2
    assert seen == [[({"": 0.0}, {"": 91.0})] * len(chips)] * 4, seen


def _serving(port: int) -> bool:
    try:
        scrape(port)
    except OSError:
        return False
    return True


def test_the_docs_metrics_table_names_every_figure_and_its_ix_exporter_and_dcgm_names() -> None:
    """The table users port their dashboards from (docs/telemetry.md, *Per-chip telemetry*): a row
    per figure, with the names the figure itself carries (so a new figure, or a renamed one, cannot
    leave the docs behind)."""
    rows = {
        line.split("|")[1].strip().strip("`"): line
        for line in (ROOT / "docs" / "telemetry.md").read_text().splitlines()
        if line.startswith("| `ix_gpu_chip_")
    }
    for figure in FIGURES:
        row = rows.get(figure.metric)
        assert row is not None, f"docs/telemetry.md has no row for {figure.metric}"
        for names in (figure.ix_exporter, figure.dcgm):  # e.g. "A + B (MiB)": A and B
            for name in re.findall(r"[A-Za-z]\w*_\w+", names):
                assert f"`{name}`" in row, (figure.metric, name)
