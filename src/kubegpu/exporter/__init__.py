"""Prometheus metrics in dcgm-exporter's names and labels, attributed to pods."""
