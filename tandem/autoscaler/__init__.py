"""Autoscaling of the prefill and decode pools.

Pure parts (no ray, kubernetes or torch): the metrics window (``metrics``; the router's
figures read by ``router_scrape``), the YAML config (``config``), the policies (``policies``:
``slo``, ``queue``, ``fixed``, and ``coupled`` in ``coupled`` with its per-worker capacity
model in ``capacity``), the stabilizer that adds min/max, cooldowns and hysteresis
(``stabilizer``), which workers a scale-down drains (``drains``), role flips beside scaling
(``flips``: the coupled policy's, where the actuator can flip), decisions (``decision``) and
their Prometheus export (``exporter``), and the control loop (``controller``). Actuators that
change the world live in ``tandem.autoscaler.actuators`` and import ray or kubernetes lazily.
"""
