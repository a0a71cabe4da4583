"""Shared pytest setup: tests marked `slow` (long fuzzing and sweeps) run only with --runslow;
SPMDLANG_VERIFY=1, so the IR verifier runs after every pass of every compile.

jax fixes its device count when first imported; the suite's meshes need up to 64 devices, so ask
for that many virtual CPU devices before anything imports jax (no effect on real accelerators).
"""

from __future__ import annotations

import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=64").strip()

# every compile in the tests runs the IR verifier after every pass (spmdlang.ir.verify)
os.environ.setdefault("SPMDLANG_VERIFY", "1")

import pytest  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="also run tests marked slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def jax_without_x64():
    """jax as configured by default (no x64) for the test: an emitted module of an earlier test that
    holds 64-bit values turns x64 on for the whole process, and under x64 jax.random.bernoulli of a
    Python float draws f64 uniforms, so a reference computed with jax.random would change."""
    import jax

    with jax.enable_x64(False):
        yield
