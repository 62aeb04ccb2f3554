"""Physical cores from the OS's CPU topology: SMT siblings share a core's FMA units and L2."""

from __future__ import annotations

from pathlib import Path

import pytest

from echosim.calibrate import bench, fit


def _sysfs(root: Path, cores: list[tuple[int, int]]) -> Path:
    for cpu, (package, core) in enumerate(cores):
        topo = root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{package}\n")
        (topo / "core_id").write_text(f"{core}\n")
    return root


def test_hyperthreads_of_one_core_count_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 4 logical CPUs: two cores with two SMT threads each (cpu0/cpu2 and cpu1/cpu3 siblings, Linux's usual order)
    root = _sysfs(tmp_path, [(0, 0), (0, 1), (0, 0), (0, 1)])
    monkeypatch.setattr(bench.os, "sched_getaffinity", lambda _: {0, 1, 2, 3})
    assert bench.physical_cores(root) == 2
    assert [bench.compute_cores(t, root) for t in (1, 2, 4)] == [1, 2, 2]
    monkeypatch.setattr(bench.os, "sched_getaffinity", lambda _: {0, 2})  # pinned to one core's two threads
    assert bench.physical_cores(root) == 1 and bench.compute_cores(2, root) == 1


def test_cores_in_two_packages_and_cpus_without_topology(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _sysfs(tmp_path, [(0, 0), (1, 0)])  # core 0 of each of two sockets: two cores
    monkeypatch.setattr(bench.os, "sched_getaffinity", lambda _: {0, 1, 2})  # cpu2 has no topology files
    assert bench.physical_cores(root) == 3


def test_the_peak_and_the_cache_follow_physical_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "physical_cores", lambda root=bench.SYSFS_CPU: 1)
    from echosim.backends.cpu import CPU_X86
    from echosim.calibrate.bench import cache_bytes

    one, _ = fit.cpu_identity_spec(CPU_X86, [], threads=1, ranks=1)
    two, notes = fit.cpu_identity_spec(CPU_X86, [], threads=2, ranks=1)  # two threads on one core's siblings
    assert two.peak_fp32_tflops == one.peak_fp32_tflops and two.cache_bytes == cache_bytes(2)
    assert "1 physical core(s) for 2 thread(s)" in notes["peak_fp32_tflops"]
    monkeypatch.setattr(bench, "physical_cores", lambda root=bench.SYSFS_CPU: 2)
    two, _ = fit.cpu_identity_spec(CPU_X86, [], threads=2, ranks=1)
    assert two.peak_fp32_tflops == pytest.approx(2 * one.peak_fp32_tflops) and two.cache_bytes == 2 * cache_bytes(2)
