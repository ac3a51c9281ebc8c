"""The environment of a sandboxed process is an allow-list (scoring/worker/env.py), on both sides.

The worker side (scoring/worker/confined.py worker_env: the model worker, the confined children) and the
training side (harness/run/train_phase.py phase_env: ranks, the sealed pack, the sandbox probe) build it
with the one function; the official's keys, tokens, proxies and data locations never reach it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from data.manifest import DATA_LOCATION_ENV
from harness.run.train_phase import PROJECT_ROOT, phase_env
from isolation.sandbox import TOKEN_ENV
from scoring.worker.confined import worker_env
from scoring.worker.env import ALLOWED, PASSED_THROUGH, SET_BY_HARNESS, names, sandbox_env

SECRET = "pgolf-planted-secret-0123"
OFFICIAL = {
    "WANDB_API_KEY": SECRET,
    "WANDB_ENTITY": "official",
    "HF_TOKEN": SECRET,
    "HUGGING_FACE_HUB_TOKEN": SECRET,
    "AWS_ACCESS_KEY_ID": SECRET,
    "AWS_SECRET_ACCESS_KEY": SECRET,
    "SSH_AUTH_SOCK": "/tmp/ssh-agent.sock",
    "GITHUB_TOKEN": SECRET,
    "OFFICIAL_TOKEN": SECRET,
    "http_proxy": "http://user:" + SECRET + "@proxy:3128",
    "HTTPS_PROXY": "http://user:" + SECRET + "@proxy:3128",
    "LD_PRELOAD": "/home/official/hook.so",
    "PYTHONSTARTUP": "/home/official/.pythonrc",
    "SLURM_JOB_ID": "1234",
    "PGOLF_COMPILE_CACHE": "/home/official/cache",
    **dict.fromkeys(DATA_LOCATION_ENV, "/data/official"),
    # what may pass
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "TZ": "UTC",
    "CUDA_VISIBLE_DEVICES": "2,3",
    "NCCL_SOCKET_IFNAME": "eth1",
    "OMP_NUM_THREADS": "7",
    # what the harness sets over the official's
    "HOME": "/home/official",
    "TMPDIR": "/tmp/official",
    "PYTHONPATH": "/opt/official/lib",
}
DROPPED = {k for k in OFFICIAL if k not in PASSED_THROUGH and k not in SET_BY_HARNESS}


def _build(tmp_path: Path, **kw) -> dict[str, str]:
    return sandbox_env(
        OFFICIAL,
        pythonpath=["/project"],
        home=tmp_path / "home",
        tmp=tmp_path,
        cache=tmp_path / "cache",
        **kw,
    )


def test_only_the_allow_list_passes_and_no_secret_value_with_it(tmp_path):
    env = _build(tmp_path)
    assert set(env) <= ALLOWED
    assert not DROPPED & set(env), sorted(DROPPED & set(env))
    assert not [k for k, v in env.items() if SECRET in v or "official" in v], env
    assert {k: env[k] for k in ("PATH", "LANG", "TZ", "CUDA_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME")} == {
        k: OFFICIAL[k] for k in ("PATH", "LANG", "TZ", "CUDA_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME")
    }


def test_the_harness_sets_its_own_over_the_officials(tmp_path):
    env = _build(tmp_path, threads=2, compile_cache=tmp_path / "compile", extra={TOKEN_ENV: "t0k"})
    assert env["HOME"] == str(tmp_path / "home") and env["TMPDIR"] == str(tmp_path)
    assert env["PYTHONPATH"] == "/project" and env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["XDG_CACHE_HOME"] == str(tmp_path / "cache")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "compile" / "inductor")
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "compile" / "triton")
    assert env["CUDA_CACHE_PATH"] == str(tmp_path / "compile" / "nv")
    assert env["OMP_NUM_THREADS"] == "2" and env[TOKEN_ENV] == "t0k"


def test_without_a_thread_count_the_officials_passes(tmp_path):
    assert _build(tmp_path)["OMP_NUM_THREADS"] == "7"
    assert "OMP_NUM_THREADS" not in sandbox_env(
        {}, pythonpath=[], home=tmp_path, tmp=tmp_path, cache=tmp_path
    )


@pytest.mark.parametrize("name", ["WANDB_API_KEY", "LD_PRELOAD", "PG_DATA_DIR", "RANK"])
def test_a_name_off_the_list_cannot_be_added(tmp_path, name):
    with pytest.raises(ValueError, match=name):
        _build(tmp_path, extra={name: "x"})


def test_the_allow_list_names_no_secret_proxy_or_data_location():
    looks_secret = re.compile(
        r"KEY|TOKEN|SECRET|PASS|AUTH|CRED|PROXY|WANDB|^HF_|^AWS|^SSH|DATA|PRELOAD|SLURM"
    )
    assert [n for n in ALLOWED - {TOKEN_ENV} if looks_secret.search(n)] == []
    assert not set(DATA_LOCATION_ENV) & ALLOWED


def test_the_worker_side_uses_the_allow_list(tmp_path, monkeypatch):
    for k, v in OFFICIAL.items():
        monkeypatch.setenv(k, v)
    env = worker_env(tmp_path, threads=1)
    assert set(env) <= ALLOWED and not DROPPED & set(env)
    assert not [k for k, v in env.items() if SECRET in v]
    assert env["PYTHONPATH"] == str(PROJECT_ROOT)  # the worker's import path is the project alone
    assert env["HOME"] == str(tmp_path / "home") and env["OMP_NUM_THREADS"] == "1"


def test_the_training_side_uses_the_allow_list(tmp_path, monkeypatch):
    monkeypatch.delenv("PGOLF_COMPILE_CACHE", raising=False)
    env = phase_env(dict(OFFICIAL), tmp_path / "out", "tok", threads=3)
    assert set(env) <= ALLOWED and not DROPPED & set(env)
    assert not [k for k, v in env.items() if SECRET in v]
    assert env[TOKEN_ENV] == "tok" and env["OMP_NUM_THREADS"] == "3" and env["PYTHONUSERBASE"]
    # the project first, then the official's own import path entries (as before the allow-list)
    assert env["PYTHONPATH"].split(":") == [str(PROJECT_ROOT), "/opt/official/lib"]
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "out" / "compile" / "inductor")
    assert (tmp_path / "out" / "home").is_dir() and (tmp_path / "out" / "compile" / "nv").is_dir()


def test_a_shared_compile_cache_is_never_a_record_tracks(tmp_path, monkeypatch):
    """A compile cache kept between runs holds code the next run executes, written by the last one's sandbox: a
    channel between entrants. The official may opt in on an unranked track; under a required sandbox (every
    record track) each run compiles into its own."""
    monkeypatch.setenv("PGOLF_COMPILE_CACHE", str(tmp_path / "shared"))
    shared = phase_env(dict(OFFICIAL), tmp_path / "a", "tok", threads=1, sandbox="auto")
    assert shared["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "shared" / "inductor")
    own = phase_env(dict(OFFICIAL), tmp_path / "b", "tok", threads=1, sandbox="required")
    assert own["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "b" / "compile" / "inductor")


def test_a_record_names_the_variables_never_their_values():
    assert names({"B": SECRET, "A": "x"}) == ["A", "B"]


def test_a_model_worker_gets_strict_mkl_reproducibility_unless_the_official_chose(tmp_path, monkeypatch):
    from scoring.worker.env import WORKER_MKL_CBWR

    monkeypatch.delenv("MKL_CBWR", raising=False)
    assert worker_env(tmp_path, threads=1)["MKL_CBWR"] == WORKER_MKL_CBWR == "AUTO,STRICT"
    monkeypatch.setenv("MKL_CBWR", "AVX2,STRICT")  # the golden run's pinning, or an official's choice
    assert worker_env(tmp_path, threads=1)["MKL_CBWR"] == "AVX2,STRICT"
