"""``tandem local`` with a vLLM user's flags, for real: its processes serve a completion under
``--served-model-name`` to a client holding the ``--api-key``, the key is on none of their
command lines, and stopping ``tandem local`` stops every one of them.

Colocated (``--no-prefill``: a decode worker and the router) to keep the start short: the
command line is the subject here, and each flag's way to the prefill worker, the same as to
the decode worker, is checked at parse level (tests/unit/tandem/test_vllm_command_line.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import openai
import psutil
import pytest

from tandem.launcher.local_cluster import ROOT, Cluster
from tests.integration.served_model import tiny_served_model

KEY = "sk-local-0123456789"


def test_tandem_local_serves_a_vllm_command_line(
    tiny_dir: Callable[..., Path], smollm2_dir: Path,
) -> None:
    model = tiny_served_model(tiny_dir, smollm2_dir)
    c = Cluster()
    try:
        local = c.start(
            "tandem.launcher.local", "--model", str(model), "--served-model-name", "my-model",
            "--api-key", KEY, "--max-model-len", "512", "--quantization", "auto",
            "--port", "0", "--prefill-threads", "1", "--decode-threads", "1",
            "--dtype", "float32", "--num-blocks", "128", "--no-prefill")
        children = psutil.Process(local.popen.pid).children(recursive=True)
        assert len(children) == 2  # decode (colocated: the line is the subject), router
        router = next(p for p in children if "tandem.router" in p.cmdline())
        key_file = Path(router.cmdline()[router.cmdline().index("--api-key-file") + 1])
        assert not any(KEY in arg for p in children for arg in p.cmdline())
        assert key_file.stat().st_mode & 0o777 == 0o600

        base = f"http://{local.info['http']}/v1"
        client = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0)
        assert [m.id for m in client.models.list().data] == ["my-model"]
        out = client.completions.create(model="my-model", prompt="Hello there",
                                        max_tokens=4, temperature=0)
        assert out.model == "my-model" and out.usage is not None
        assert out.usage.completion_tokens == 4
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base, api_key="sk-wrong", max_retries=0).models.list()
        # What it printed to try works when pasted (the key comes from the private file).
        try_it = next(line for line in local.log if line.startswith("Try it:"))
        assert KEY not in try_it and f"--api-key-file {key_file}" in try_it
        pasted = subprocess.run(try_it.removeprefix("Try it:").strip() + " --max-tokens 4",
                                shell=True, cwd=ROOT, capture_output=True, text=True,
                                timeout=120)
        assert pasted.returncode == 0, pasted.stderr
    finally:
        c.stop()
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in children)
    assert not key_file.parent.exists()  # the private key file went with the cluster
