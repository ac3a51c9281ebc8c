"""The config loads without torch (harness/config.py's lazy imports), and still refuses every bad value first.

`pgolf run` calls validate_run before the pipeline (and torch) load. Each value here was refused before
the lazy imports; the attack is a value that now slips through to the run. None does: each is refused
with a ConfigError naming the `--set` that gave it. The last test shows the check runs without torch.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.config import validate_run
from scoring.errors import ConfigError
from tests.conftest import REPO

TINY_LM = REPO / "tests" / "fixtures" / "submissions" / "tiny_lm"


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["pack.codec='nope'"], "is not a codec"),
        (["pack.codec='int8_zlib:level=99'"], "is not a codec"),
        (["pack.codec='int6:bogus=1'"], "is not a codec"),
        (["pack.codec=':'"], "is not a codec"),
        (["pack.codec='submission'"], "codec.py, which is missing"),
        (["pack.gptq_batches=2", "pack.codec='int8_zlib'"], "GPTQ needs a per-row integer codec"),
        (["eval.mode='slidin'"], "is not a mode"),
        (["eval.dtype='float16'"], "is not allowed"),
        (["eval.stride=5"], "applies to the sliding and documents modes only"),
        (["eval.max_tokens=10"], "must be 0 (the full split) or more than eval.seq_len"),
        (["eval.seq_len=1e999"], "has type float"),
        (["eval.adapt_chunk_tokens=0"], "must be positive"),
    ],
)
def test_a_bad_pack_or_eval_value_is_refused_before_the_run(overrides, said):
    with pytest.raises(ConfigError) as e:
        validate_run(TINY_LM, None, overrides)
    assert said in str(e.value) and str(e.value).startswith(f"--set {overrides[0]}"), str(e.value)


def test_the_plain_keys_are_checked_without_torch():
    code = (
        "import sys; from harness.config import validate_run\n"
        "try:\n    validate_run(sys.argv[1], None, ['eval.mode=\"slidin\"'])\n"
        "except ValueError as e:\n    print('refused', 'torch' in sys.modules)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(TINY_LM)], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert r.stdout.strip() == "refused False", (r.stdout, r.stderr[-2000:])
