"""Which optional features can run on which Home Assistant install (the musl story).

HA OS and HA Container are Alpine (musl); many installs are aarch64 boards. For each
optional feature this asks pip (``pip install --dry-run --platform … --only-binary
=:all: --no-deps``: the resolution ``pip download`` makes, from the index's wheel
metadata without fetching the wheels) whether a CPython 3.13 wheel of what it needs
exists for musllinux and aarch64, and prints the table. It is a report: only the
the numpy echo canceller must find its wheel everywhere (pymicro-vad has no
musllinux wheel on PyPI: HA's own wheel index builds it, as an HA requirement). Offline it skips; answers are cached for a week in pytest's cache, each
question bounded by a timeout, so the suite pays for them once.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
import json
import subprocess
import sys
import tempfile
import time

import pytest

PLATFORMS = (
    "musllinux_1_2_x86_64",
    "musllinux_1_2_aarch64",
    "manylinux_2_28_aarch64",
)
# pip takes the tags it is given literally: each platform with the older tags an
# install of it accepts too.
_TAGS = {
    "musllinux_1_2_x86_64": ("musllinux_1_2_x86_64", "musllinux_1_1_x86_64"),
    "musllinux_1_2_aarch64": ("musllinux_1_2_aarch64", "musllinux_1_1_aarch64"),
    "manylinux_2_28_aarch64": (
        "manylinux_2_28_aarch64",
        "manylinux_2_17_aarch64",
        "manylinux2014_aarch64",
    ),
}
# feature -> (the wheels it needs, must PyPI have them for every install). HA
# requirements (numpy, pymicro-vad) reach every install anyway: HA builds its own
# musl wheels (wheels.home-assistant.io) and installs them with HA itself.
FEATURES: dict[str, tuple[tuple[str, ...], bool]] = {
    "duplex VAD (pymicro-vad; HA installs it)": (("pymicro-vad==1.0.1",), False),
    "server echo cancellation, numpy (default)": (("numpy==2.2.2",), True),
    "server echo cancellation, AEC3 (livekit)": (("livekit==1.2.1",), False),
    "server wake word (pyopen-wakeword)": (("pyopen-wakeword==1.1.0",), False),
}
CACHE_KEY = "rtvoice/wheels-v2"
CACHE_DAYS = 7
TIMEOUT_S = 60


def _has_wheel(requirement: str, platform: str) -> bool | None:
    """True/False: a wheel resolves; None: pip could not ask (offline, timeout)."""
    with tempfile.TemporaryDirectory() as target:
        command = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--no-deps",
            "--only-binary=:all:",
            *(arg for tag in _TAGS[platform] for arg in ("--platform", tag)),
            "--python-version",
            "3.13",
            "--target",
            target,
            "--quiet",
            "--disable-pip-version-check",
            "--retries",
            "1",
            "--timeout",
            "15",
            "--report",
            "-",
            requirement,
        ]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            return None
    if done.returncode == 0:
        return bool(json.loads(done.stdout or "{}").get("install"))
    error = done.stderr.lower()
    if "no matching distribution" in error or "could not find a version" in error:
        return False
    return None  # network or index trouble: unknown


def _table(cache: pytest.Cache) -> dict[str, dict[str, bool | None]]:
    cached = cache.get(CACHE_KEY, None)
    if cached and time.time() - cached["at"] < CACHE_DAYS * 86400:
        return cached["table"]
    questions = [
        (req, platform)
        for reqs, _ in FEATURES.values()
        for req in reqs
        for platform in PLATFORMS
    ]
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(lambda q: _has_wheel(*q), questions))
    table: dict[str, dict[str, bool | None]] = {}
    for (req, platform), answer in zip(questions, answers, strict=True):
        table.setdefault(req, {})[platform] = answer
    if all(answer is not None for answer in answers):
        cache.set(CACHE_KEY, {"at": time.time(), "table": table})
    return table


def test_optional_features_per_platform(
    request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """Print which feature has its wheels where; the everywhere-features must."""
    table = _table(request.config.cache)
    if all(v is None for row in table.values() for v in row.values()):
        pytest.skip("the package index could not be asked (offline)")
    mark = {True: "yes", False: "NO", None: "?"}
    lines = [f"{'feature':46} " + " ".join(f"{p:24}" for p in PLATFORMS)]
    for feature, (reqs, _) in FEATURES.items():
        cells = []
        for platform in PLATFORMS:
            answers = [table[req][platform] for req in reqs]
            value = (
                None if None in answers else all(a for a in answers if a is not None)
            )
            cells.append(f"{mark[value]:24}")
        lines.append(f"{feature:46} " + " ".join(cells))
    with capsys.disabled():
        print(  # noqa: T201 - the table is the report
            "\nwheels for CPython 3.13 (pip --platform):\n" + "\n".join(lines)
        )
    for feature, (reqs, everywhere) in FEATURES.items():
        if not everywhere:
            continue
        for req in reqs:
            for platform in PLATFORMS:
                assert table[req][platform] is not False, (feature, req, platform)
