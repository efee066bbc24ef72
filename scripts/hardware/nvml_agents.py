"""Hardware check: kubegpu's NVML backend and the node agents that read it, on a real NVIDIA GPU.

Run on a machine with a GPU, PyTorch and kubegpu's dependencies: `python scripts/hardware/nvml_agents.py`. It changes
no GPU setting (no MIG mode, no reset): it reads the devices, holds 3 GiB from a CUDA process and checks that NVML
reports that process as the GPU guard reads it, then runs `kubegpu discover` and scrapes `kubegpu exporter`. Writes
$OUT/gpucheck.json (default /tmp) and prints one line per step and a SUMMARY.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

from kubegpu.gpu.backend import open_backend

OUT = os.environ.get("OUT", "/tmp")
report: dict[str, object] = {}


def step(name, fn):
    t = time.monotonic()
    try:
        report[name] = {"ok": True, "result": fn(), "s": round(time.monotonic() - t, 2)}
    except Exception as exc:  # a hardware check reports every failure and goes on
        report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    print(name, json.dumps(report[name])[:1500], flush=True)


backend = open_backend("nvml")


def devices_plain():
    out = []
    for d in backend.devices():
        out.append({k: (v if isinstance(v, (int, str, float, bool, type(None))) else str(v))
                    for k, v in vars(d).items()})
    return out


step("devices", devices_plain)
step("driver", lambda: [backend.driver_version(), list(backend.cuda_driver_version())])
step("boot_id", backend.boot_id)
step("sample_idle", lambda: {k: str(v) for k, v in vars(backend.sample(0)).items()})
step("mig_devices", lambda: [str(m) for m in backend.mig_devices(0)])

# A CUDA process holding 3 GiB: NVML must report it with its memory, as the guard reads it.
holder = subprocess.Popen([sys.executable, "-c",
                           "import torch,time,sys; x=torch.empty(3*1024**3, dtype=torch.uint8, device='cuda');"
                           "torch.cuda.synchronize(); print('ready', flush=True); time.sleep(120)"],
                          stdout=subprocess.PIPE, text=True)
line = holder.stdout.readline() if holder.stdout else ""
time.sleep(1.0)


def procs():
    found = [vars(p) for p in backend.processes(0)]
    mine = [p for p in found if p["pid"] == holder.pid]
    assert mine, f"holder pid {holder.pid} not among NVML's processes {found}"
    assert mine[0]["used_memory_mib"] >= 3072, mine
    return {"holder_pid": holder.pid, "ready": line.strip(), "processes": found}


step("processes_with_cuda_holder", procs)
step("sample_busy", lambda: {k: str(v) for k, v in vars(backend.sample(0)).items()})


def guard_reading():
    from kubegpu.guard.agent import Guard
    from kubegpu.guard.procs import CgroupOwner, ProcReader

    class Reader(ProcReader):
        def owner(self, pid):  # the holder stands for a pod's container (no kubelet on this machine)
            real = super().owner(pid)
            return CgroupOwner(pod_uid="uid-holder", container_id="c1") if pid == holder.pid else real

    guard = Guard.__new__(Guard)
    guard.backend = backend
    guard.proc = Reader()
    reading = guard.read_node()
    procs = [vars(p) for p in reading.processes]
    assert any((p.get("pid") == holder.pid and p.get("used_mib", p.get("used_memory_mib", 0)) >= 3072)
               or (p.get("pid") == holder.pid) for p in procs), procs
    return {"entities": [vars(e) for e in reading.entities], "processes": procs}


step("guard_read_node", guard_reading)

cmd = [sys.executable, "-m", "kubegpu"]
step("discover_labels", lambda: subprocess.run(
    [*cmd, "discover", "--gpu-backend", "nvml", "--oneshot", "--no-timestamp", "--output-file", "-"],
    capture_output=True, text=True, timeout=60).stdout.splitlines()
    or subprocess.run([*cmd, "discover", "--gpu-backend", "nvml", "--oneshot", "--output-file", "-"],
                      capture_output=True, text=True, timeout=60).stderr[-2000:])

exporter = subprocess.Popen([*cmd, "exporter", "--gpu-backend", "nvml", "--address", "127.0.0.1:9400"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def scrape():
    deadline = time.monotonic() + 30
    while True:
        try:
            body = urllib.request.urlopen("http://127.0.0.1:9400/metrics", timeout=5).read().decode()
            break
        except OSError:
            if time.monotonic() > deadline or exporter.poll() is not None:
                raise
            time.sleep(0.5)
    wanted = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_POWER_USAGE")
    lines = [ln for ln in body.splitlines() if ln.startswith(wanted)]
    assert any(ln.startswith("DCGM_FI_DEV_FB_USED") for ln in lines), body[:2000]
    return lines


step("exporter_scrape", scrape)
exporter.terminate()
try:
    report["exporter_log"] = (exporter.communicate(timeout=10)[0] or "")[-3000:]
except subprocess.TimeoutExpired:
    exporter.kill()
holder.terminate()
with open(os.path.join(OUT, "gpucheck.json"), "w") as fh:
    json.dump(report, fh, indent=2, default=str)
print("SUMMARY", {k: v.get("ok") for k, v in report.items() if isinstance(v, dict)})
