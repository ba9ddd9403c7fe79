"""The two scalable roles, as plain strings shared by configs, metrics and actuators."""

from __future__ import annotations

from typing import Literal

RoleName = Literal["prefill", "decode"]
ROLES: tuple[RoleName, RoleName] = ("prefill", "decode")
