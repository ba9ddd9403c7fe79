"""Autoscaling of the prefill and decode pools.

Pure parts (no ray, kubernetes or torch): the metrics window (``metrics``), the YAML config
(``config``), the policies (``policies``: ``slo``, ``queue``, ``fixed``), the stabilizer that
adds min/max, cooldowns and hysteresis (``stabilizer``), decisions (``decision``) and their
Prometheus export (``exporter``), and the control loop (``controller``). Actuators that change
the world live in ``autoscaler.actuators`` and import ray or kubernetes lazily.
"""
