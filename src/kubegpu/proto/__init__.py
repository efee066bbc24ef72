"""Protocol buffers kubegpu speaks (kubelet APIs), with their generated code committed.

Regenerate with `scripts/gen_protos.sh`. Each .proto keeps its upstream `package` (e.g. `v1beta1`) because the
kubelet matches gRPC method paths like `/v1beta1.Registration/Register`; the directory gives the Python module path.
"""
