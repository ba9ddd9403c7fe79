"""Actuators change replica counts: ``ray_actuator`` (worker actors in a Ray cluster) and
``kubernetes`` (the replicas of the Helm chart's prefill/decode Deployments).

Both implement ``tandem.autoscaler.controller.Actuator``; each imports its client library itself,
so importing this package needs neither ray nor kubernetes.
"""
