"""sglang-difflab: verify SGLang fixes by the behaviour of their real code.

Kept free of imports: this package is also imported inside the probe
processes, where only the standard library and SGLang are present.
"""

__version__ = "0.1.0"
