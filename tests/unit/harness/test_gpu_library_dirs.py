"""The CUDA/NCCL library folders a GPU phase loads become read roots of its sandbox when they lie outside
the usual ones (isolation/landlock.py gpu_library_dirs): a cluster's /cm/shared/apps/cuda, a module's NCCL,
the driver's folder named by LD_LIBRARY_PATH. Discovery is tested on a fake /proc/PID/maps."""

from __future__ import annotations

from isolation.landlock import SYSTEM_READ_ROOTS, gpu_library_dirs
from tests.unit.harness.test_launch import LANDLOCK_ROOT, _plan


def _tree(tmp_path):
    libs = {
        "apps/cuda12.4/lib64": "libcudart.so.12.4.127",
        "apps/nccl/lib": "libnccl.so.2.21.5",
        "apps/other/lib": "libz.so.1",
        "driver/lib64": "libcuda.so.1",
        "venv/site-packages/nvidia/cublas/lib": "libcublas.so.12",
    }
    for folder, name in libs.items():
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / name).write_bytes(b"\x7fELF")
    return libs


def test_mapped_and_ld_library_path_gpu_folders_outside_the_read_roots(tmp_path):
    libs = _tree(tmp_path)
    maps = "\n".join(
        [
            "55d0c0a00000-55d0c0a21000 r--p 00000000 08:01 1048602                    /usr/bin/python3.11",
            f"7f1c2a000000-7f1c2a200000 r-xp 00000000 08:01 2231 {tmp_path}/apps/cuda12.4/lib64/{libs['apps/cuda12.4/lib64']}",
            f"7f1c2b000000-7f1c2b400000 r-xp 00010000 08:01 2232 {tmp_path}/apps/nccl/lib/libnccl.so.2.21.5 (deleted)",
            f"7f1c2c000000-7f1c2c100000 r-xp 00000000 08:01 2233 {tmp_path}/apps/other/lib/libz.so.1",
            f"7f1c2d000000-7f1c2d100000 r-xp 00000000 08:01 2234 {tmp_path}/venv/site-packages/nvidia/cublas/lib/libcublas.so.12",
            "7f1c2e000000-7f1c2e100000 r-xp 00000000 08:01 99 /usr/lib/x86_64-linux-gnu/libcudart.so.12",
            "7ffd5b3f0000-7ffd5b411000 rw-p 00000000 00:00 0                          [stack]",
            "7f1c2f000000-7f1c2f100000 rw-p 00000000 00:00 0 ",
        ]
    )
    ld = f"{tmp_path}/driver/lib64:{tmp_path}/apps/other/lib:/nonexistent"
    covered = [*SYSTEM_READ_ROOTS, str(tmp_path / "venv")]  # the Python roots hold the pip wheels' libraries
    assert gpu_library_dirs(maps, ld, covered) == sorted(
        [
            str(tmp_path / "apps/cuda12.4/lib64"),
            str(tmp_path / "apps/nccl/lib"),
            str(tmp_path / "driver/lib64"),
        ]
    )
    assert gpu_library_dirs("", "", covered) == []


def test_a_cuda_phase_reads_the_driver_folder_a_cpu_phase_does_not(tmp_path, monkeypatch):
    _tree(tmp_path)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path / "driver/lib64"))
    driver = str(tmp_path / "driver/lib64")
    cuda, _ = _plan(tmp_path, LANDLOCK_ROOT, device="cuda")
    assert driver in cuda.describe()["read_roots"]
    cpu, _ = _plan(tmp_path, LANDLOCK_ROOT, device="cpu")
    assert not any(r.path == driver for r in cpu.rules)
