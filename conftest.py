"""Root pytest setup shared by both systems' test suites.

pytest's importlib mode names a test module after its path (``dgcc/tests/test_x.py`` ->
``dgcc.tests.test_x``) and would otherwise create the parent ``dgcc`` as an empty namespace
module for the project folder, shadowing the installed package. Importing the real packages
first keeps ``import dgcc`` / ``import yatt`` meaning the installed code. Both imports are cheap.
"""

import contextlib
import os

from hypothesis import HealthCheck, settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

for _package in ("dgcc", "yatt"):
    with contextlib.suppress(ImportError):  # a user may install only one of the systems
        __import__(_package)

# One set of hypothesis profiles for both suites (profiles are global to the pytest process).
# "ci" (the default) is bounded and derandomized so CI runs are reproducible; "dev" explores
# more: HYPOTHESIS_PROFILE=dev make test.
_QUIET_CHECKS = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=_QUIET_CHECKS,
)
settings.register_profile(
    "dev", max_examples=1000, deadline=None, suppress_health_check=_QUIET_CHECKS
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
