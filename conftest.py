"""Root pytest setup shared by both systems' test suites.

pytest's importlib mode names a test module after its path (``dgcc/tests/test_x.py`` ->
``dgcc.tests.test_x``) and would otherwise create the parent ``dgcc`` as an empty namespace
module for the project folder, shadowing the installed package. Importing the real packages
first keeps ``import dgcc`` / ``import yatt`` meaning the installed code. Both imports are cheap.
"""

import contextlib
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

for _package in ("dgcc", "yatt"):
    with contextlib.suppress(ImportError):  # a user may install only one of the systems
        __import__(_package)
