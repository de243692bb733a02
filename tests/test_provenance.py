"""A record's provenance: the CPU model and kernels that decide a CPU run's last bits, and
the thread count its hardware names."""

from __future__ import annotations

from pathlib import Path

import torch

from pe_bench import provenance as where
from pe_bench.provenance import device_name, provenance


def test_provenance_names_the_cpu_model_and_its_kernels(monkeypatch):
    """What decides the last bits of a CPU run (docs/reliability.md#determinism): the CPU's
    model and the vector kernels ATen dispatches to, as torch names them."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(where, "cpu_model", lambda: "AMD EPYC 9654 96-Core Processor")
    fields = provenance(torch.device("cpu"))
    assert fields["cpu_model"] == "AMD EPYC 9654 96-Core Processor"
    assert fields["cpu_capability"] == "AVX512"
    assert fields["hardware"].startswith("cpu (")  # as before: reports group by it


def test_cpu_model_reads_the_model_name_line(monkeypatch, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD  EPYC\n")
    real = Path

    def fake_path(*args):
        return cpuinfo if args == ("/proc/cpuinfo",) else real(*args)

    where.cpu_model.cache_clear()
    monkeypatch.setattr(where, "Path", fake_path)
    try:
        assert where.cpu_model() == "AMD EPYC"
    finally:
        where.cpu_model.cache_clear()


def test_a_cpu_s_thread_count_is_singular_for_one(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert device_name(torch.device("cpu")).endswith(", 1 thread)")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert device_name(torch.device("cpu")).endswith(", 2 threads)")
