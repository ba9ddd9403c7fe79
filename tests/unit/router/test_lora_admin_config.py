"""The router's runtime LoRA routes are never open: the flag without admin keys is refused."""

from __future__ import annotations

import pytest

from tandem.router.auth import ApiKeyFileError
from tandem.router.config import RouterConfig
from tandem.router.security import RouterSecurity


def test_runtime_lora_updates_need_an_admin_key(tmp_path) -> None:
    config = RouterConfig(tokenizer_dir=str(tmp_path), model_name="m", max_model_len=64, insecure=True,
                          allow_runtime_lora_updates=True)
    with pytest.raises(ApiKeyFileError, match="--admin-key-file"):
        RouterSecurity.from_config(config)
    keys = tmp_path / "admin"
    keys.write_text("k\n")
    keys.chmod(0o600)
    security = RouterSecurity.from_config(RouterConfig(
        tokenizer_dir=str(tmp_path), model_name="m", max_model_len=64, insecure=True,
        allow_runtime_lora_updates=True,
        admin_key_file=str(keys)))
    assert security.admin_keys is not None and security.admin_keys.allows("Bearer k")
