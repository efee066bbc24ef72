"""The kubelet device plugin (API v1beta1): resource accounting, sharing, MIG strategies, health, lifecycle.

Modules: `resources` (pure accounting, shared with the simulator, GFD labels and the autoscaler), `allocate`,
`preferred`, `health`, `cdi`, `mps` (pure cores), `server` (one grpc.aio server per resource), `manager`
(lifecycle: registration, kubelet restarts, relist, health, reload), `metrics`, `cli`.

Where we differ from NVIDIA's plugin, on purpose:
* `resources` patterns and per-resource `rename` / `devices` are honoured (NVIDIA resets them), so a node can
  have exclusive GPUs next to shared ones with different replica counts; a listed device missing from the node
  is an error.
* A critical XID marks every replica and MIG device of the GPU Unhealthy (NVIDIA marks one, #1929), and the GPU
  recovers after `--health-quiet-period` seconds without critical XIDs and a successful probe (NVIDIA never does).
  Health is exported as `kubegpu_device_plugin_device_healthy{resource,device}`.
* The config file is reloaded in place on change or SIGHUP; unchanged resources keep their server and stream.
* MPS replicas and memory slices carry per-container `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` and
  `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, and `CUDA_MPS_LOG_DIRECTORY` is mounted read-only next to the pipe.
* CDI device names use NVIDIA's kind `k8s.device-plugin.nvidia.com/gpu` (the toolkit's own spec holds
  `nvidia.com/gpu`), and the cdi-annotations key is derived from the device IDs instead of a random response id.
"""
