"""Public API of algos, rewards, data and heads: `__all__` lists exactly the public names, and
`yatt.algos` stays pure torch (no transformers or Ray import).

Method: compare `__all__` with the module's public attributes; import algos in a fresh process.
"""

import subprocess
import sys
import types

import pytest

import yatt.algos
import yatt.data
import yatt.heads
import yatt.rewards


@pytest.mark.parametrize("module", [yatt.algos, yatt.rewards, yatt.data, yatt.heads])
def test_all_lists_every_public_name(module):
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
        and getattr(value, "__module__", module.__name__).startswith(module.__name__)
    }  # fmt: skip
    assert set(module.__all__) <= set(vars(module)), "a name in __all__ does not exist"
    assert public <= set(module.__all__), f"public but not exported: {public - set(module.__all__)}"


def test_algos_imports_no_heavy_dependencies():
    code = (
        "import sys, yatt.algos; "
        "print(sorted(m for m in ('transformers', 'ray', 'vllm') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
