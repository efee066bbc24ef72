"""Kubelet device-plugin API."""
