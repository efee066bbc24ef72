"""Hardware check: the MPS limits kubegpu sets (the device plugin's per-resource control daemon, 4 replicas) hold on a
real GPU — a client allocating 80 % of its pinned-memory limit succeeds, one allocating 110 % fails — and what NVML
shows the GPU guard of MPS clients. `python scripts/hardware/mps_limits.py` on a machine with a GPU, PyTorch and
`nvidia-cuda-mps-control`; no GPU setting is changed, and the daemon is quit at the end. Writes $OUT/mps.json."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from kubegpu.gpu.backend import open_backend
from kubegpu.sharing.mps import plans_for
from kubegpu.sharing.mps_control import MpsControl, find_mps_control

OUT = os.environ.get("OUT", "/tmp")
report: dict[str, object] = {}
backend = open_backend("nvml")
gpus = backend.devices()
root = tempfile.mkdtemp(prefix="kubegpu-mps-")
config = {"version": "v1", "flags": {"mpsRoot": root},
          "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
plans = plans_for(gpus, {}, config)
report["plans"] = [{"resource": p.resource, "pipe": p.pipe_dir, "commands": p.commands} for p in plans]
binary = find_mps_control()
report["binary"] = binary
control = MpsControl(Path(root), binary)
print("plans", report["plans"], "binary", binary, flush=True)
CLIENT = ("import os,sys,time,torch\n"
          "gib=float(sys.argv[1])\n"
          "try:\n"
          "    x=torch.empty(int(gib*1024**3),dtype=torch.uint8,device='cuda')\n"
          "    torch.cuda.synchronize(); print('ok', flush=True)\n"
          "except Exception as e:\n"
          "    print('fail', type(e).__name__, str(e).splitlines()[0][:200], flush=True); sys.exit(3)\n"
          "time.sleep(float(sys.argv[2]))\n")
try:
    started = control.start(plans)
    report["started"] = started
    plan = plans[0]
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": plan.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": plan.log_dir}
    limit_mib = plan.gpus[0].pinned_memory_mib
    report["limit_mib"] = limit_mib
    under = limit_mib / 1024 * 0.8
    over = limit_mib / 1024 * 1.1
    holder = subprocess.Popen([sys.executable, "-c", CLIENT, str(under), "20"], env=env, stdout=subprocess.PIPE,
                              text=True)
    report["under_limit"] = {"gib": round(under, 1), "result": holder.stdout.readline().strip()}
    seen = [vars(p) for p in backend.processes(0)]
    report["nvml_processes_under_mps"] = seen
    report["holder_pid"] = holder.pid
    try:
        environ = Path(f"/proc/{holder.pid}/environ").read_bytes()
        from kubegpu.guard.procs import mps_limit_from_environ
        report["guard_mps_limit_from_environ"] = mps_limit_from_environ(environ)
    except Exception as exc:  # reported, not raised: the limit check below still runs
        report["guard_mps_limit_from_environ"] = repr(exc)
    res = subprocess.run([sys.executable, "-c", CLIENT, str(over), "0"], env=env, capture_output=True, text=True,
                         timeout=120)
    report["over_limit"] = {"gib": round(over, 1), "rc": res.returncode, "out": res.stdout.strip()[-300:],
                            "err": res.stderr.strip()[-300:]}
    holder.terminate()
    holder.wait(timeout=30)
finally:
    control.stop(plans)
    logs = Path(plans[0].log_dir) if plans else None
    if logs and logs.is_dir():
        report["daemon_log_tail"] = "".join(p.read_text(errors="replace")[-1500:] for p in sorted(logs.glob("*.log")))
print(json.dumps(report, indent=1, default=str)[:6000])
Path(OUT, "mps.json").write_text(json.dumps(report, indent=2, default=str))
