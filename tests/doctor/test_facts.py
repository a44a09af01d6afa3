"""Device facts: nvidia-smi's CSV as it prints it (read through a real subprocess: an `nvidia-smi` script on
PATH replays recorded output), the busy decision, and the CPU's facts."""

from __future__ import annotations

import os
import stat

import pytest

from breeze_worker.doctor.facts import (
    APP_FIELDS,
    BUSY_MEMORY_BYTES,
    SMI_FIELDS,
    SmiSample,
    cpu_facts,
    device_uuid,
    judge_busy,
    match_smi,
    parse_csv_row,
    sample_smi,
)

# `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` on an idle T4 (fields in SMI_FIELDS order)
T4_ROW = ("GPU-5c1e0d2a-7b1f-4e2c-9d4e-0a1b2c3d4e5f, Tesla T4, 535.104.05, P8, 300, 405, 1590, 5001, 0, 0, 15360, "
          "9.85, 70.00, 31")
A100_ROW = ("GPU-11111111-2222-3333-4444-555555555555, NVIDIA A100-SXM4-80GB, 550.54.15, P0, 1410, 1593, 1410, "
            "1593, 87, 40312, 81920, [N/A], [Not Supported], 55")
APPS = "4242, 40310, GPU-11111111-2222-3333-4444-555555555555"


def test_parse_csv_row_numbers_text_and_not_available():
    row = parse_csv_row(A100_ROW, SMI_FIELDS)
    assert row["uuid"].startswith("GPU-1111") and row["name"] == "NVIDIA A100-SXM4-80GB"
    assert row["driver_version"] == "550.54.15" and row["pstate"] == "P0"
    assert row["clocks.sm"] == 1410.0 and row["utilization.gpu"] == 87.0 and row["memory.used"] == 40312.0
    assert row["power.draw"] is None and row["power.limit"] is None  # [N/A], [Not Supported]
    with pytest.raises(ValueError, match="14 values for 3 fields"):
        parse_csv_row(A100_ROW, APP_FIELDS)


def _fake_smi(tmp_path, monkeypatch, gpus: str, apps: str, rc: int = 0):
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n"
                      f"case \"$1\" in --query-gpu=*) printf '%s\\n' \"{gpus}\";; "
                      f"--query-compute-apps=*) printf '%s\\n' \"{apps}\";; esac\n"
                      f"exit {rc}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")


def test_sample_smi_reads_every_gpu_and_process(tmp_path, monkeypatch):
    _fake_smi(tmp_path, monkeypatch, f"{T4_ROW}\n{A100_ROW}", APPS)
    sample = sample_smi()
    assert sample.error is None
    assert set(sample.gpus) == {"gpu-5c1e0d2a-7b1f-4e2c-9d4e-0a1b2c3d4e5f", "gpu-11111111-2222-3333-4444-555555555555"}
    assert sample.gpus["gpu-5c1e0d2a-7b1f-4e2c-9d4e-0a1b2c3d4e5f"]["clocks.max.sm"] == 1590.0
    assert sample.apps == [{"pid": 4242.0, "used_memory": 40310.0,
                            "gpu_uuid": "GPU-11111111-2222-3333-4444-555555555555"}]


class _Uuid:  # torch 2.11's device-properties UUID: prints the bare UUID
    def __init__(self, text):
        self.text = text

    def __str__(self):
        return self.text


class _Props:
    def __init__(self, uuid):
        self.uuid = uuid


def test_the_device_is_matched_to_its_nvidia_smi_row_by_uuid():
    sample = SmiSample(gpus={k.lower(): parse_csv_row(v, SMI_FIELDS) for k, v in (
        ("GPU-5c1e0d2a-7b1f-4e2c-9d4e-0a1b2c3d4e5f", T4_ROW), ("GPU-11111111-2222-3333-4444-555555555555", A100_ROW))},
        apps=[parse_csv_row(APPS, APP_FIELDS)])
    a100 = device_uuid(_Props(_Uuid("11111111-2222-3333-4444-555555555555".upper())))
    assert a100 == "gpu-11111111-2222-3333-4444-555555555555"
    row, apps, error = match_smi(a100, sample)
    assert row["name"] == "NVIDIA A100-SXM4-80GB" and [a["pid"] for a in apps] == [4242.0] and error is None
    row, apps, error = match_smi(device_uuid(_Props("GPU-5C1E0D2A-7B1F-4E2C-9D4E-0A1B2C3D4E5F")), sample)
    assert row["name"] == "Tesla T4" and apps == [] and error is None
    assert match_smi("gpu-0", sample)[2].startswith("nvidia-smi lists no GPU with this device's UUID")
    assert match_smi(a100, SmiSample(error="FileNotFoundError: nvidia-smi is not on PATH"))[2].endswith("PATH")
    assert match_smi(a100, None) == (None, None, "nvidia-smi was not read")
    assert device_uuid(_Props(None)) is None


def test_sample_smi_failures_become_a_reason(tmp_path, monkeypatch):
    _fake_smi(tmp_path, monkeypatch, T4_ROW, "", rc=9)
    assert "nvidia-smi exited 9" in sample_smi().error
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert "not on PATH" in sample_smi().error


def test_busy_when_another_process_uses_the_gpu():
    a100 = parse_csv_row(A100_ROW, SMI_FIELDS)
    apps = [parse_csv_row(APPS, APP_FIELDS)]
    reasons = judge_busy(a100, apps, own_pid=1, memory_used_by_others=None)
    assert reasons[0] == "1 other process(es) use this GPU (pid 4242; 40310 MiB)"
    assert "GPU utilization 87% before the doctor started" in reasons
    assert judge_busy(a100, apps, own_pid=4242, memory_used_by_others=None) == [
        "GPU utilization 87% before the doctor started"]  # itself is not "another process"


def test_idle_and_container_cases():
    t4 = parse_csv_row(T4_ROW, SMI_FIELDS)
    assert judge_busy(t4, [], own_pid=1, memory_used_by_others=0) == []
    # a container: nvidia-smi lists no processes, but memory is in use
    crowded = {**t4, "memory.used": 9000.0}
    assert judge_busy(crowded, [], own_pid=1, memory_used_by_others=None) == [
        "9000 MiB of GPU memory in use before the doctor started"]
    # no nvidia-smi at all: torch's view of memory held outside this process decides
    assert judge_busy(None, None, own_pid=1, memory_used_by_others=BUSY_MEMORY_BYTES - 1) == []
    assert judge_busy(None, None, own_pid=1, memory_used_by_others=3 * 2**30) == [
        "3.0 GiB of GPU memory held outside this process"]


def test_cpu_facts():
    facts = cpu_facts()
    doc = facts.to_dict()
    assert doc["type"] == "cpu" and doc["busy"] is False and doc["capability"] is None
    assert doc["name"].startswith("cpu (") and doc["cpu_count"] >= 1
    assert {"python", "torch", "torch_cuda", "cudnn", "triton", "transformers"} <= set(doc["versions"])
