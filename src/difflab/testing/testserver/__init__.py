"""An SGLang-compatible stand-in for a 1P1D deployment, with switches for the pre-fix behaviours.

It serves the endpoints the scenarios and the preflight use (``/generate`` with
streaming, ``/model_info`` or ``/get_model_info``, ``/server_info``, ``/metrics``,
``/abort_request``, ``/health``) from a paged KV pool that never zeroes pages, so
the GPU tier's logic is proven on a CPU: every detector must fire with its bug
switched on and stay quiet with it off.
"""

from difflab.testing.testserver.config import TestServerConfig, base_config, head_config, safe_env
from difflab.testing.testserver.http import TestDeployment

__all__ = ["TestDeployment", "TestServerConfig", "base_config", "head_config", "safe_env"]
