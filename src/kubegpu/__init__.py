"""kubegpu: shareable, fully used GPUs in Kubernetes."""

__version__ = "0.1.0"
